"""What one benchmark row measures, and how the sweep flags expand into rows.

A Workload is pure data (no torch): shapes, dtype, mask, layout and direction.
Dense rows keep the total token count fixed (B = tokens / S) and the hidden
size fixed (H = hidden / Dv); packed (THD) rows use a list of sequence lengths.
Backward rows may ask for a deterministic backward; with both modes a row's
deterministic twin follows it, so their time ratio can be read side by side.
Paged rows (layout "paged", forward only) read K and V from a paged cache
(num_blocks, block_size, H_kv, D) through a shuffled block table: decode rows
(S_q = 1, `paged_batch` sequences of each cache length) report the K/V bytes they
read per second beside TFLOP/s, prefill rows (S_q = S_kv, causal, B = tokens / S)
TFLOP/s. Each paged shape also gets its contiguous twin (the same row over a dense
BSHD cache, once for all block sizes), so that a report can say what the table costs.
"""

from __future__ import annotations

import math
import random
from dataclasses import asdict, dataclass, field, replace

from frost.bench.flops import sdpa_flops

DTYPES = ("bf16", "fp16")
DIRECTIONS = ("fwd", "bwd")
LAYOUTS = ("bshd", "thd", "paged")
DEFAULT_PAGED_BLOCK_SIZES = (16, 64, 128, 256)
DEFAULT_THD_LENGTHS = (4096, 2048, 1024, 3000, 517, 5000, 768, 1)
#: the token count the dense rows hold by default and the fixed packed mix is defined at
DEFAULT_TOKENS = 16384
ELEMENT_BYTES = {"bf16": 2, "fp16": 2}


@dataclass(frozen=True)
class Workload:
    direction: str  # "fwd" | "bwd"
    dtype: str  # "bf16" | "fp16"
    d_qk: int
    d_v: int
    heads_q: int
    heads_kv: int
    causal: bool
    layout: str = "bshd"  # "bshd" (dense, BSHD physical) | "thd" (packed)
    batch: int = 1
    seqlen_q: int = 0
    seqlen_kv: int = 0
    seqlens: tuple = ()  # THD: per-sequence lengths (q and kv alike)
    mix: str = ""  # THD: name of the length mix
    probe: bool = False  # host-time probe instead of throughput
    deterministic: bool = False  # bwd: a run-to-run reproducible backward ("det" in labels)
    block_size: int = 0  # paged: rows per cache block

    @property
    def is_paged(self) -> bool:
        return self.layout == "paged"

    @property
    def blocks_per_seq(self) -> int:
        return -(-self.seqlen_kv // self.block_size) if self.is_paged else 0

    @property
    def num_blocks(self) -> int:
        """Paged: every sequence's blocks, plus a spare one (the table never points to it)."""
        return self.batch * self.blocks_per_seq + 1 if self.is_paged else 0

    @property
    def is_decode(self) -> bool:
        """One query row a sequence over a longer cache: K/V bytes read per second are the measure."""
        return not self.is_thd and self.seqlen_q == 1 and self.seqlen_kv > 1

    def contiguous_twin(self) -> "Workload":
        """A paged row's twin over a dense (BSHD) cache: same shape, mask and batch."""
        return replace(self, layout="bshd", block_size=0)

    def kv_bytes(self) -> int:
        """Bytes of K and V one call reads (each key and value once)."""
        return self.total_kv * self.heads_kv * (self.d_qk + self.d_v) * ELEMENT_BYTES[self.dtype]

    # ---- derived geometry -------------------------------------------------
    @property
    def is_thd(self) -> bool:
        return self.layout == "thd"

    @property
    def gqa_ratio(self) -> int:
        return self.heads_q // self.heads_kv

    @property
    def num_seqs(self) -> int:
        return len(self.seqlens) if self.is_thd else self.batch

    @property
    def total_q(self) -> int:
        return sum(self.seqlens) if self.is_thd else self.batch * self.seqlen_q

    @property
    def total_kv(self) -> int:
        return sum(self.seqlens) if self.is_thd else self.batch * self.seqlen_kv

    @property
    def max_seqlen(self) -> int:
        return max(self.seqlens) if self.is_thd else max(self.seqlen_q, self.seqlen_kv)

    @property
    def scale(self) -> float:
        return self.d_qk**-0.5

    @property
    def head_dim_label(self) -> str:
        return f"{self.d_qk}" if self.d_qk == self.d_v else f"{self.d_qk}x{self.d_v}"

    @property
    def direction_label(self) -> str:
        return f"{self.direction} det" if self.deterministic else self.direction

    @property
    def shape_label(self) -> str:
        if self.is_thd:
            return f"thd {self.mix} ({len(self.seqlens)} seq, T={self.total_q})"
        if self.is_paged:
            kind = "decode" if self.is_decode else "prefill"
            return f"paged{self.block_size} {kind} {self.batch}x{self.seqlen_q}x{self.seqlen_kv}"
        if self.seqlen_q == self.seqlen_kv:
            return f"{self.batch}x{self.seqlen_q}"
        return f"{self.batch}x{self.seqlen_q}x{self.seqlen_kv}"

    @property
    def heads_label(self) -> str:
        return f"{self.heads_q}" if self.heads_q == self.heads_kv else f"{self.heads_q}:{self.heads_kv}"

    @property
    def label(self) -> str:
        kind = "probe " if self.probe else ""
        mask = "causal" if self.causal else "full"
        return (
            f"{kind}{self.direction_label} {self.dtype} d{self.head_dim_label} {self.shape_label} "
            f"h{self.heads_label} {mask}"
        )

    def flops(self) -> float:
        if self.is_thd:
            return sdpa_flops(
                heads=self.heads_q,
                d_qk=self.d_qk,
                d_v=self.d_v,
                causal=self.causal,
                direction=self.direction,
                seqlens_q=self.seqlens,
            )
        return sdpa_flops(
            heads=self.heads_q,
            d_qk=self.d_qk,
            d_v=self.d_v,
            causal=self.causal,
            direction=self.direction,
            batch=self.batch,
            seqlen_q=self.seqlen_q,
            seqlen_kv=self.seqlen_kv,
        )

    def set_bytes(self) -> int:
        """Device bytes of one input/output buffer set (q, k, v, o, and do/dq/dk/dv for bwd)."""
        e = ELEMENT_BYTES[self.dtype]
        q = self.total_q * self.heads_q * self.d_qk
        k = self.total_kv * self.heads_kv * self.d_qk
        v = self.total_kv * self.heads_kv * self.d_v
        o = self.total_q * self.heads_q * self.d_v
        n = q + k + v + o
        if self.direction == "bwd":
            n += o + q + k + v  # do, dq, dk, dv
        return n * e

    def to_dict(self) -> dict:
        d = asdict(self)
        d["seqlens"] = list(self.seqlens)
        d["label"] = self.label
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "Workload":
        names = {f for f in cls.__dataclass_fields__}
        kw = {k: v for k, v in d.items() if k in names}
        kw["seqlens"] = tuple(kw.get("seqlens", ()))
        return cls(**kw)


# ---- flag parsing ---------------------------------------------------------------
def parse_size(text: str) -> int:
    """'4096', '4k', '16K' -> int."""
    t = text.strip().lower()
    mult = 1
    if t.endswith("k"):
        mult, t = 1024, t[:-1]
    try:
        n = int(t) * mult
    except ValueError:
        raise ValueError(f"not a size: {text!r}") from None
    if n <= 0:
        raise ValueError(f"size must be positive: {text!r}")
    return n


def parse_head_dim(text: str) -> tuple[int, int]:
    """'128' -> (128, 128); '192x128' -> (192, 128)."""
    t = text.strip().lower()
    if "x" in t:
        a, b = t.split("x", 1)
        return parse_size(a), parse_size(b)
    d = parse_size(t)
    return d, d


def parse_gqa(text: str) -> int:
    """GQA ratio Hq/Hkv: '4' or 'Hq:Hkv' such as '32:8' (-> 4)."""
    t = text.strip()
    if ":" in t:
        a, b = (parse_size(x) for x in t.split(":", 1))
        if a % b:
            raise ValueError(f"GQA {text!r}: Hq must be a multiple of Hkv")
        return a // b
    return parse_size(t)


def split_list(text: str) -> list[str]:
    return [x.strip() for x in text.split(",") if x.strip()]


def random_mix(total_tokens: int, max_len: int, seed: int) -> tuple[int, ...]:
    """A seeded, realistic packed-batch length mix summing to exactly `total_tokens`.

    Lengths are log-uniform in [1, max_len] (many short documents, a few long ones);
    the last one is cut to land on the total.
    """
    rng = random.Random(seed)
    lens: list[int] = []
    left = total_tokens
    while left > 0:
        n = int(round(math.exp(rng.uniform(0.0, math.log(max_len)))))
        n = max(1, min(n, left))
        lens.append(n)
        left -= n
    return tuple(lens)


@dataclass
class SweepSpec:
    """The sweep the flags describe; `expand()` turns it into workloads."""

    directions: list = field(default_factory=lambda: ["fwd", "bwd"])
    dtypes: list = field(default_factory=lambda: ["bf16"])
    head_dims: list = field(default_factory=lambda: [(64, 64), (128, 128), (256, 256)])
    seqlens: list = field(default_factory=lambda: [512, 1024, 2048, 4096, 8192, 16384])
    tokens: int = DEFAULT_TOKENS
    hidden: int = 2048
    heads_q: int = 0  # query heads of every row (0: hidden / Dv), so a head-dim sweep keeps its head count
    causal: list = field(default_factory=lambda: [False, True])
    deterministic: list = field(default_factory=lambda: [False])  # bwd modes; fwd rows ignore it
    gqa: list = field(default_factory=lambda: [1])
    layouts: list = field(default_factory=lambda: ["bshd"])
    thd_mixes: list = field(default_factory=lambda: ["fixed", "random"])
    thd_lengths: tuple = DEFAULT_THD_LENGTHS
    thd_max_len: int = 8192
    paged_block_sizes: list = field(default_factory=lambda: list(DEFAULT_PAGED_BLOCK_SIZES))
    paged_batch: int = 64  # decode rows' sequences
    seed: int = 0
    probe: bool = True
    skipped: list = field(default_factory=list)  # combinations expand() left out, with the reason

    def heads(self, d_v: int, ratio: int) -> tuple[int, int]:
        if self.heads_q:
            hq, source = self.heads_q, "--heads"
        elif self.hidden % d_v:
            raise ValueError(
                f"hidden {self.hidden} is not a multiple of head dim {d_v} (fix the head count with --heads)"
            )
        else:
            hq, source = self.hidden // d_v, f"hidden {self.hidden} / D {d_v}"
        if ratio < 1 or hq % ratio:
            raise ValueError(f"GQA ratio {ratio} does not divide Hq={hq} ({source})")
        return hq, hq // ratio

    def thd_mix(self, name: str) -> tuple[int, ...]:
        """The packed mix's lengths. The fixed default mix is defined at DEFAULT_TOKENS: other `tokens` scale
        each length (at least 1), so `--tokens` sizes packed rows as it sizes dense ones; lengths given with
        --thd-lengths are used as given."""
        if name == "fixed":
            if tuple(self.thd_lengths) == DEFAULT_THD_LENGTHS and self.tokens != DEFAULT_TOKENS:
                return tuple(max(1, round(n * self.tokens / DEFAULT_TOKENS)) for n in DEFAULT_THD_LENGTHS)
            return tuple(self.thd_lengths)
        if name == "random":
            return random_mix(self.tokens, self.thd_max_len, self.seed)
        raise ValueError(f"unknown THD mix {name!r} (use fixed, random)")

    def expand(self) -> list[Workload]:
        """Every workload of the sweep; impossible (head dim, GQA) pairs are left out and listed in `skipped`."""
        out: list[Workload] = []
        self.skipped = []

        def add(w: Workload) -> None:
            modes = self.deterministic if w.direction == "bwd" else [False]
            out.extend(replace(w, deterministic=bool(d)) for d in modes)

        for direction in self.directions:
            for dtype in self.dtypes:
                for d_qk, d_v in self.head_dims:
                    for ratio in self.gqa:
                        try:
                            hq, hkv = self.heads(d_v, ratio)
                        except ValueError as e:
                            if str(e) not in self.skipped:
                                self.skipped.append(str(e))
                            continue
                        for causal in self.causal:
                            if "bshd" in self.layouts:
                                for s in self.seqlens:
                                    if s > self.tokens:
                                        why = (
                                            f"sequence length {s} is longer than --tokens {self.tokens} (a row "
                                            f"holds --tokens tokens)"
                                        )
                                        if why not in self.skipped:
                                            self.skipped.append(why)
                                        continue
                                    b = self.tokens // s
                                    add(
                                        Workload(
                                            direction,
                                            dtype,
                                            d_qk,
                                            d_v,
                                            hq,
                                            hkv,
                                            causal,
                                            layout="bshd",
                                            batch=b,
                                            seqlen_q=s,
                                            seqlen_kv=s,
                                        )
                                    )
                            if "paged" in self.layouts:
                                self._paged(direction, dtype, d_qk, d_v, hq, hkv, causal, out)
                            if "thd" in self.layouts:
                                for mix in self.thd_mixes:
                                    lens = self.thd_mix(mix)
                                    name = mix if mix == "fixed" else f"random(seed={self.seed})"
                                    add(
                                        Workload(
                                            direction,
                                            dtype,
                                            d_qk,
                                            d_v,
                                            hq,
                                            hkv,
                                            causal,
                                            layout="thd",
                                            seqlens=lens,
                                            mix=name,
                                        )
                                    )
        if not out and self.skipped:
            raise ValueError("; ".join(self.skipped))
        return out

    def _paged(self, direction, dtype, d_qk, d_v, hq, hkv, causal, out) -> None:
        """Paged rows of one (head dims, heads, mask): decode rows unmasked (one query row sees every key: the
        bottom-right causal mask is no mask), prefill rows causal (S_q = S_kv: both alignments agree). Each shape's
        contiguous twin goes first, once (unless the sweep's dense rows already hold it)."""
        if direction != "fwd":
            note = "paged K/V caches are forward only (as in cuDNN): no paged backward rows"
            if note not in self.skipped:
                self.skipped.append(note)
            return
        for s in self.seqlens:
            if causal:
                shape = dict(batch=max(1, self.tokens // s), seqlen_q=s, seqlen_kv=s)
            else:
                shape = dict(batch=self.paged_batch, seqlen_q=1, seqlen_kv=s)
            rows = [
                Workload(direction, dtype, d_qk, d_v, hq, hkv, causal, layout="paged", block_size=bs, **shape)
                for bs in self.paged_block_sizes
            ]
            if rows and rows[0].contiguous_twin() not in out:
                out.append(rows[0].contiguous_twin())
            out.extend(rows)

    def probes(self) -> list[Workload]:
        """The tiny-problem host-time probe: 1x1x128x64, one per direction and dtype."""
        if not self.probe:
            return []
        return [
            Workload(
                direction,
                self.dtypes[0],
                64,
                64,
                1,
                1,
                False,
                layout="bshd",
                batch=1,
                seqlen_q=128,
                seqlen_kv=128,
                probe=True,
            )
            for direction in self.directions
        ]
