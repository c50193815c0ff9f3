"""cuDNN's ragged-offset form as cuDNN's own tests declare it, on the DSL engines, against the float64 oracle.

Every io tensor has an offset tensor of its own (q, k, v, o; dO takes o's, dQ q's, dK k's, dV v's), each holding
element offsets of its own tensor (prefix sums times H * D of that tensor), so with d_qk != d_v or K and V head
counts apart no two groups of offsets agree. Stats are per batch (B, H, S, 1). Additive bias (with dBias in the
backward) and ALiBi ride along. Sequences are packed at the storage's start; the tail past them is NaN.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import accumulate

import pytest
import torch

import frost
from test import oracle
from test.oracle import assert_close_to_oracle

pytestmark = pytest.mark.gpu


@dataclass(frozen=True)
class CudnnRagged:
    lens: tuple = ((100, 130), (0, 17), (257, 200), (64, 1))  # (len_q, len_kv) per batch entry
    hq: int = 6
    hk: int = 6
    hv: int = 6
    dqk: int = 128
    dv: int = 128
    causal: bool = False
    bias: str = ""  # "": none; "h": (1, Hq, S_q, S_kv); "b": (B, 1, S_q, S_kv)
    alibi: bool = False
    totals: int = 0  # declare max_total_seq_len_q/kv as cuDNN's tests do: the totals rounded up to this (0: none)
    pad: int = 3  # the declared S past the longest sequence
    rows: str = ""  # the forward's score_max / score_sum_exp: "ragged" (each its own offsets, Stats too) or "batch"
    dtype: torch.dtype = torch.bfloat16

    def id(self) -> str:
        return (
            f"h{self.hq}x{self.hk}x{self.hv}-d{self.dqk}x{self.dv}"
            + "-causal" * self.causal
            + (f"-bias{self.bias}" if self.bias else "")
            + "-alibi" * self.alibi
            + f"-tot{self.totals}" * bool(self.totals)
            + (f"-rows{self.rows}" if self.rows else "")
        )

    @property
    def s(self) -> tuple:
        return max(a for a, _ in self.lens) + self.pad, max(c for _, c in self.lens) + self.pad


def _storage(b, s, h, d, dtype, gen, n_tokens, fill=None):
    """A (B, H, S, D) bshd view over B * S tokens: the first n_tokens random (or `fill`), the tail NaN."""
    x = torch.full((b * s, h, d), float("nan"), device=gen.device, dtype=dtype)
    if fill is None:
        x[:n_tokens] = torch.randn(n_tokens, h, d, generator=gen, device=gen.device).to(dtype)
    else:
        x[:n_tokens] = fill
    return x.as_strided((b, h, s, d), (s * h * d, d, h * d, 1))


def _packed(x, n_tokens):
    """The first n_tokens tokens of a bshd view: (T, H, D)."""
    h, d = x.shape[1], x.shape[3]
    return x.as_strided((n_tokens, h, d), (h * d, d, 1), x.storage_offset())


def make(case: CudnnRagged, direction: str = "fwd", seed: int = 0, device: str = "cuda", target=None):
    """(graph, variant pack, tensors, host prefix sums) of one case, declared the way cuDNN's tests declare it.

    `device="cpu"` with a fake `target` plans the same graph on the CPU (test/cpu/test_gpu_test_routing.py)."""
    gen = torch.Generator(device=device).manual_seed(seed)
    b = len(case.lens)
    (sq, skv), lq, lk = case.s, [a for a, _ in case.lens], [c for _, c in case.lens]
    cq, ck = [0, *accumulate(lq)], [0, *accumulate(lk)]
    tq, tk = cq[-1], ck[-1]
    t = {
        "q": _storage(b, sq, case.hq, case.dqk, case.dtype, gen, tq),
        "k": _storage(b, skv, case.hk, case.dqk, case.dtype, gen, tk),
        "v": _storage(b, skv, case.hv, case.dv, case.dtype, gen, tk),
    }
    offsets = {
        "q": (cq, case.hq * case.dqk, torch.int64),
        "k": (ck, case.hk * case.dqk, torch.int32),
        "v": (ck, case.hv * case.dv, torch.int32),
        "o": (cq, case.hq * case.dv, torch.int64),
    }
    for role, (prefix, per_token, kind) in offsets.items():
        t[f"off_{role}"] = (torch.tensor(prefix, device=device) * per_token).to(kind).view(-1, 1, 1, 1)
    t["len_q"] = torch.tensor(lq, dtype=torch.int32, device=device).view(b, 1, 1, 1)
    t["len_kv"] = torch.tensor(lk, dtype=torch.int32, device=device).view(b, 1, 1, 1)
    row_roles = ("stats", "score_max", "score_sum_exp") if case.rows and direction == "fwd" else ("stats",)
    for role in row_roles:
        if case.rows == "ragged":  # (B, H, S, 1) over packed rows: token stride H, offsets prefix * H
            t[role] = torch.full((b * sq * case.hq,), float("nan"), device=device).as_strided(
                (b, case.hq, sq, 1), (sq * case.hq, 1, case.hq, 1)
            )
            t[f"off_{role}"] = (torch.tensor(cq, device=device) * case.hq).view(-1, 1, 1, 1)
        else:
            t[role] = torch.full((b, case.hq, sq, 1), float("nan"), device=device)
    if case.bias:
        shape = (1, case.hq, sq, skv) if case.bias == "h" else (b, 1, sq, skv)
        t["bias"] = torch.randn(shape, generator=gen, device=device).to(case.dtype)

    g = frost.Graph(
        io_data_type=case.dtype,
        intermediate_data_type=torch.float32,
        compute_data_type=torch.float32,
        **({"target": target} if target is not None else {}),
    )
    decl = {n: g.tensor_like(t[n], name=n) for n in t if n.startswith(("off_", "len_"))}
    for role in ("q", "k", "v"):
        decl[role] = g.tensor_like(t[role], name=role).set_ragged_offset(decl[f"off_{role}"])
    kw = dict(
        attn_scale=case.dqk**-0.5,
        use_padding_mask=True,
        seq_len_q=decl["len_q"],
        seq_len_kv=decl["len_kv"],
        use_causal_mask=case.causal,
        use_alibi_mask=case.alibi,
    )
    if case.bias:
        decl["bias"] = kw["bias"] = g.tensor_like(t["bias"], name="bias")
    if case.totals:
        kw.update(
            max_total_seq_len_q=-(-tq // case.totals) * case.totals,
            max_total_seq_len_kv=-(-tk // case.totals) * case.totals,
        )
    if direction == "fwd":
        t["o"] = _storage(b, sq, case.hq, case.dv, case.dtype, gen, tq, fill=float("nan"))
        for role in row_roles[1:]:
            decl[role] = kw[role] = g.tensor_like(t[role], name=role)
        o, stats = g.sdpa(decl["q"], decl["k"], decl["v"], generate_stats=True, **kw)
        o.set_output(True).set_dim(list(t["o"].shape)).set_stride(t["o"].stride()).set_ragged_offset(decl["off_o"])
        stats.set_output(True).set_stride(t["stats"].stride())
        decl.update(o=o, stats=stats)
        if case.rows == "ragged":
            for role in row_roles:
                decl[role].set_ragged_offset(decl[f"off_{role}"])
    else:
        t["o"] = _storage(b, sq, case.hq, case.dv, case.dtype, gen, tq, fill=0.0)
        t["dO"] = _storage(b, sq, case.hq, case.dv, case.dtype, gen, tq)
        for n in ("o", "dO"):
            decl[n] = g.tensor_like(t[n], name=n).set_ragged_offset(decl["off_o"])
        decl["stats"] = g.tensor_like(t["stats"], name="stats")
        if case.bias:
            t["dBias"] = torch.full_like(t["bias"], float("nan"))
            decl["dBias"] = kw["dBias"] = g.tensor_like(t["dBias"], name="dBias")
        grads = g.sdpa_backward(decl["q"], decl["k"], decl["v"], decl["o"], decl["dO"], decl["stats"], **kw)
        for n, grad, like in zip(("dQ", "dK", "dV"), grads, ("q", "k", "v")):
            t[n] = torch.full_like(t[like], float("nan"))
            grad.set_output(True).set_dim(list(t[n].shape)).set_stride(t[n].stride())
            grad.set_ragged_offset(decl[f"off_{like}"])
            decl[n] = grad
    return g, {decl[n]: t[n] for n in decl}, t, (cq, ck)


def _oracle(case, t, prefix, grads=False):
    cq, ck = prefix
    q, k, v = _packed(t["q"], cq[-1]), _packed(t["k"], ck[-1]), _packed(t["v"], ck[-1])
    kw = dict(
        scale=case.dqk**-0.5,
        bias=t.get("bias"),
        alibi=case.alibi,
        cu_seq_len_q=cq,
        cu_seq_len_kv=ck,
        causal=case.causal,
    )
    if not grads:
        return oracle.attention(q, k, v, row_stats=True, **kw)
    return oracle.attention_grads(q, k, v, _packed(t["dO"], cq[-1]), with_dbias=bool(case.bias), **kw)


def _run(g, pack):
    ws = torch.full((g.get_workspace_size(),), 0xFF, dtype=torch.uint8, device="cuda")  # poisoned scratch
    g.execute(pack, ws, frost.ExecutionContext(stream=torch.cuda.current_stream()))
    torch.cuda.synchronize()


def _stats_per_batch(t, prefix, lse):
    """Write packed (T, H) LSE rows into the per-batch (B, H, S, 1) Stats."""
    cq = prefix[0]
    for i in range(len(cq) - 1):
        t["stats"][i, :, : cq[i + 1] - cq[i], 0] = lse[cq[i] : cq[i + 1]].transpose(0, 1).float()


CASES = [
    CudnnRagged(),  # four offset tensors, equal values in each group
    CudnnRagged(dqk=64, dv=128, causal=True),  # O's and V's token strides differ from Q's and K's
    CudnnRagged(hq=6, hk=3, hv=1, dqk=128, dv=64),  # K and V head counts apart
    CudnnRagged(hq=6, hk=2, hv=2, dqk=56, dv=96, causal=True, bias="h"),
    CudnnRagged(hq=4, hk=4, hv=4, dqk=128, dv=128, causal=True, bias="b", alibi=True),
    CudnnRagged(hq=8, hk=1, hv=1, dqk=32, dv=64, causal=True, alibi=True, dtype=torch.float16),
    # cuDNN's own failing draw: S_q 1024 > S_kv 512, a token envelope below S (its totals rounded up to 64)
    CudnnRagged(
        lens=((700, 300), (250, 77)), hq=6, hk=1, hv=1, dqk=56, dv=96, causal=True, bias="h", totals=64, pad=400
    ),
    CudnnRagged(hq=8, hk=2, hv=2, causal=True, rows="ragged"),  # score_max / score_sum_exp from their own offsets
    CudnnRagged(dqk=64, dv=64, hq=4, hk=4, hv=4, rows="batch"),  # per batch with Stats
    # d_v above 256 (O in column slices on the wgmma forward; every row output from the first slice), and d_qk
    # above 512: cuDNN's tests draw 264 and 520
    CudnnRagged(hq=6, hk=2, hv=2, dqk=56, dv=520, causal=True, rows="ragged"),
    CudnnRagged(hq=2, hk=2, hv=2, dqk=520, dv=264, rows="batch"),
]


def expected_decline(engine: str, case: CudnnRagged, direction: str) -> bool:
    """Whether `engine` ("sm90" / "sm80") is expected to decline the case: only the mma.sync forward, above head
    dim 256. Both backwards plan every case (K and V head counts apart included). Checked against the planner on
    fake targets by test/cpu/test_gpu_test_routing.py, so this expectation cannot drift from the routing."""
    return engine == "sm80" and direction == "fwd" and max(case.dqk, case.dv) > 256


@pytest.mark.parametrize("engine", ["sm90", "sm80"])
@pytest.mark.parametrize("case", CASES, ids=CudnnRagged.id)
def test_cudnn_ragged_forward_runs_on_the_dsl_engines(engine, case):
    g, pack, t, prefix = make(case)
    g.validate()
    if expected_decline(engine, case, "fwd"):
        with pytest.raises(frost.NotSupportedError) as e:
            g.build_plans(engine=engine)
        pytest.skip(f"{engine} declines as expected: {e.value.declines}")
    g.build_plans(engine=engine)
    assert "Dsl" in g.engine_name
    _run(g, pack)
    o_ref, lse_ref, max_ref, sum_ref = _oracle(case, t, prefix)
    tq = prefix[0][-1]
    got = _packed(t["o"], tq)
    assert not torch.isnan(got).any(), "O rows of the sequences left unwritten"
    assert torch.isnan(_packed(t["o"], t["o"].shape[0] * t["o"].shape[2])[tq:]).all(), "O written past them"
    assert_close_to_oracle(got, o_ref, rel=1e-2, name="O")
    for role, ref in (("stats", lse_ref), ("score_max", max_ref), ("score_sum_exp", sum_ref)):
        if role not in t:
            continue
        for i in range(len(prefix[0]) - 1):
            got = _row_outputs(case, t, role, prefix, i).double()
            want = ref[prefix[0][i] : prefix[0][i + 1]].transpose(0, 1)
            finite = torch.isfinite(want)
            assert torch.equal(torch.isfinite(got), finite), role
            if finite.any():
                assert (got[finite] - want[finite]).abs().max().item() < 2e-3 * max(1.0, want[finite].abs().max()), role


def _row_outputs(case, t, role, prefix, i):
    """(H, len_q) values of batch entry i of a row output (Stats, score_max, score_sum_exp), ragged or per batch."""
    n = prefix[0][i + 1] - prefix[0][i]
    x = t[role]
    if case.rows != "ragged":
        return x[i, :, :n, 0]
    return x.as_strided((case.hq, n), (1, case.hq), x.storage_offset() + prefix[0][i] * case.hq)


@pytest.mark.parametrize("engine", ["sm90", "sm80"])
@pytest.mark.parametrize("case", CASES, ids=CudnnRagged.id)
def test_cudnn_ragged_backward_runs_on_the_dsl_engines(engine, case):
    if case.rows:
        pytest.skip("score_max / score_sum_exp are forward outputs; the backward cases without them cover it")
    g, pack, t, prefix = make(case, "bwd")
    g.validate()
    if expected_decline(engine, case, "bwd"):
        with pytest.raises(frost.NotSupportedError) as e:
            g.build_plans(engine=engine)
        pytest.skip(f"{engine} declines as expected: {e.value.declines}")
    g.build_plans(engine=engine)
    assert "Dsl" in g.engine_name
    want = _oracle(case, t, prefix, grads=True)
    cq, ck = prefix
    _packed(t["o"], cq[-1]).copy_(want[0].to(case.dtype))
    _stats_per_batch(t, prefix, want[1])
    _run(g, pack)
    for name, ref, total in (("dQ", want[2], cq[-1]), ("dK", want[3], ck[-1]), ("dV", want[4], ck[-1])):
        got = _packed(t[name], total)
        assert not torch.isnan(got).any(), f"{name}: rows of the sequences left unwritten"
        assert_close_to_oracle(got, ref, rel=2e-2, kind="grad", name=name)
    for name, total in (("dK", ck[-1]), ("dV", ck[-1])):
        x = t[name]
        assert torch.isnan(_packed(x, x.shape[0] * x.shape[2])[total:]).all(), f"{name} written past the sequences"
    if case.bias:
        assert_close_to_oracle(t["dBias"], want[6], rel=2e-2, kind="grad", name="dBias")
