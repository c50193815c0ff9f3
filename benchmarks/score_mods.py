"""Time the forward or backward with cuDNN's score modifiers on every engine that plans it, in one process.

    python3 benchmarks/score_mods.py --direction fwd,bwd --d 128 --s 4096,16384 --causal 0,1 --bias bh,h --alibi 0,1

Each row is one graph (bf16, BSHD, 16k tokens, hidden 2048 / D heads): a bias of the given broadcast ("bh" full,
"h" per head, "b" per batch entry, "1" shared, "none" without), in the backward with its dBias (`--dbias 0` leaves
it out), and
ALiBi where asked (it needs a causal mask, as in cuDNN). It is planned through the graph API on each engine by name
(`--engines`, default: the wgmma backward, the mma.sync backward and the cuDNN engine); an engine that declines
prints its reason. The last column times the same problem without modifiers on the wgmma engine, so the
modifiers' cost reads as a ratio. TFLOP/s count the backward as 2.5x the forward's matmul FLOPs (design.md); the
modifiers' own work is not counted. Needs a CUDA GPU.
"""

from __future__ import annotations

import argparse
import json
import math
import sys

import torch

import frost
from frost.bench.flops import sdpa_flops, tflops
from quick_problem import timed

ENGINES = ("sm90", "sm80", "cudnn")


def graph(direction, b, s, h, d, causal, bias, dbias, alibi, t):
    """The forward or backward graph over the given tensors; returns (graph, variant pack)."""
    g = frost.Graph(io_data_type=torch.bfloat16, intermediate_data_type=torch.float32, compute_data_type=torch.float32)
    roles = ("q", "k", "v") if direction == "fwd" else ("q", "k", "v", "o", "dO", "stats")
    h_ = {r: g.tensor_like(t[r], name=r) for r in roles}
    kw = dict(attn_scale=1.0 / math.sqrt(d))
    if causal:
        kw["use_causal_mask"] = True
    if alibi:
        kw["use_alibi_mask"] = True
    decl = {}
    if bias != "none":
        decl["bias"] = kw["bias"] = g.tensor_like(t["bias"], name="bias")
        if dbias and direction == "bwd":
            decl["dBias"] = kw["dBias"] = g.tensor_like(t["dBias"], name="dBias")
    if direction == "fwd":
        o, stats = g.sdpa(h_["q"], h_["k"], h_["v"], generate_stats=True, **kw)
        outs = zip(("o", "stats"), (o, stats))
    else:
        outs = zip(("dQ", "dK", "dV"), g.sdpa_backward(h_["q"], h_["k"], h_["v"], h_["o"], h_["dO"], h_["stats"], **kw))
    for role, gh in outs:
        gh.set_output(True).set_dim(tuple(t[role].shape)).set_stride(tuple(t[role].stride()))
        decl[role] = gh
    return g, {**{h_[r]: t[r] for r in h_}, **{decl[r]: t[r] for r in decl}}


def inputs(b, s, h, d, bias):
    """(B, H, S, D) views of BSHD tensors, Stats (B, H, S, 1), and the bias / dBias of the given broadcast."""
    torch.manual_seed(0)
    t = {
        r: torch.randn(b, s, h, d, dtype=torch.bfloat16, device="cuda").transpose(1, 2)
        for r in ("q", "k", "v", "o", "dO")
    }
    t["stats"] = torch.randn(b, h, s, 1, dtype=torch.float32, device="cuda").abs() + math.log(s)
    for r in ("dQ", "dK", "dV"):
        t[r] = torch.empty_like(t[r[1].lower()])
    if bias != "none":
        dims = (b if "b" in bias else 1, h if "h" in bias else 1, s, s)
        t["bias"] = torch.randn(dims, dtype=torch.bfloat16, device="cuda")
        t["dBias"] = torch.empty_like(t["bias"])
    return t


def run(direction, engine, b, s, h, d, causal, bias, dbias, alibi, t, knobs=None):
    """Median ms of one execute on `engine` (with `knobs` requested, if given), or the engine's decline."""
    g, pack = graph(direction, b, s, h, d, causal, bias, dbias, alibi, t)
    g.validate()
    try:
        g.build_plans(engine=engine, knobs=knobs)
    except frost.NotSupportedError as e:
        return f"declined: {e.declines}"
    ws = torch.empty(g.get_workspace_size(), dtype=torch.uint8, device="cuda")
    ctx = frost.ExecutionContext()
    return timed(lambda: g.execute(pack, ws, ctx))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--direction", default="bwd", help="fwd, bwd or both (fwd,bwd)")
    ap.add_argument("--d", default="128")
    ap.add_argument("--s", default="4096,16384")
    ap.add_argument("--causal", default="0,1")
    ap.add_argument("--bias", default="bh,h")
    ap.add_argument("--dbias", type=int, default=1)
    ap.add_argument("--alibi", default="0")
    ap.add_argument("--engines", default=",".join(ENGINES))
    ap.add_argument(
        "--sm90-variants",
        default="[]",
        help="JSON list of knob sets: one more wgmma column each (e.g. '[{\"tile_m\": 64}]')",
    )
    a = ap.parse_args(argv)
    variants = json.loads(a.sm90_variants)
    if not torch.cuda.is_available():
        print("needs a CUDA GPU", file=sys.stderr)
        return 2
    engines = a.engines.split(",")
    columns = [(e, None) for e in engines] + [("sm90", v) for v in variants]
    print(
        "| dir | d | s | causal | bias | dBias | alibi | "
        + " | ".join(engines)
        + "".join(f" | sm90 {json.dumps(v)}" for v in variants)
        + " | sm90 plain |"
    )
    print("|" + "---|" * (8 + len(columns)))
    for direction, d in ((x, int(y)) for x in a.direction.split(",") for y in a.d.split(",")):
        for s in map(int, a.s.split(",")):
            b, h = max(1, 16384 // s), 2048 // d
            for causal in map(int, a.causal.split(",")):
                flops = sdpa_flops(heads=h, d_qk=d, causal=bool(causal), direction=direction, batch=b, seqlen_q=s)
                for bias in a.bias.split(","):
                    for alibi in map(int, a.alibi.split(",")):
                        if alibi and not causal:
                            continue  # cuDNN's rule: ALiBi needs a causal mask
                        t = inputs(b, s, h, d, bias)
                        cells = []
                        for e, knobs in columns + [("sm90", None)]:
                            plain = len(cells) == len(columns)
                            ms = run(
                                direction,
                                e,
                                b,
                                s,
                                h,
                                d,
                                causal,
                                "none" if plain else bias,
                                a.dbias and not plain,
                                0 if plain else alibi,
                                t,
                                knobs,
                            )
                            cells.append(ms if isinstance(ms, str) else f"{ms:.3f} ms {tflops(flops, ms):.0f} TF")
                        has_db = a.dbias if bias != "none" and direction == "bwd" else "-"
                        print(
                            f"| {direction} | {d} | {s} | {causal} | {bias} | {has_db} | {alibi} | "
                            + " | ".join(cells)
                            + " |",
                            flush=True,
                        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
