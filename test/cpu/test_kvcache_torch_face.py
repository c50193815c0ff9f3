"""`flash_attn_with_kvcache` on the CPU (the reference engine attends, the append's torch reference writes) against
a float64 oracle that appends and gathers by hand; and the append kernel's params, name and compile for sm_80 and
sm_90a (no GPU: the kernel's numerics are the GPU tests' to check)."""

from __future__ import annotations

import pytest
import torch

from frost.errors import UnsupportedArgumentError
from frost.torch_face import plan_cache_info
from frost.torch_face.kvcache import flash_attn_with_kvcache
from test import oracle
from test.compile_runner import compile_groups


def _expected(q, caches, new, lens, table, *, scale, sink=None, **mask):
    """Append by hand into copies of the caches, gather each sequence's keys, attend in float64 (bottom-right)."""
    kc, vc = (c.clone() for c in caches)
    b, s_q, hq, d = q.shape
    s_new = 0 if new is None else new[0].shape[1]
    for i in range(b):
        for s in range(s_new):
            pos = lens[i] + s
            if table is None:
                kc[i, pos], vc[i, pos] = new[0][i, s], new[1][i, s]
            else:
                blk, row = int(table[i, pos // kc.shape[1]]), pos % kc.shape[1]
                kc[blk, row], vc[blk, row] = new[0][i, s], new[1][i, s]
    total = [n + s_new for n in lens]
    width = max(total)
    kd = torch.zeros(b, kc.shape[2], width, d, dtype=torch.float64)
    vd = torch.zeros(b, vc.shape[2], width, vc.shape[3], dtype=torch.float64)
    for i in range(b):
        for j in range(total[i]):
            if table is None:
                kd[i, :, j], vd[i, :, j] = kc[i, j].double(), vc[i, j].double()
            else:
                blk, row = int(table[i, j // kc.shape[1]]), j % kc.shape[1]
                kd[i, :, j], vd[i, :, j] = kc[blk, row].double(), vc[blk, row].double()
    o, lse = oracle.attention(
        q.transpose(1, 2),
        kd,
        vd,
        scale=scale,
        sink=sink,
        seq_len_q=[s_q] * b,
        seq_len_kv=total,
        alignment="BOTTOM_RIGHT",
        **mask,
    )
    return o.transpose(1, 2), lse, kc, vc


def _paged_cache(b, hk, d, bs, blocks_per_seq, spare=2, seed=0):
    g = torch.Generator().manual_seed(seed)
    n = b * blocks_per_seq + spare
    kc, vc = torch.randn(n, bs, hk, d, generator=g), torch.randn(n, bs, hk, d, generator=g)
    table = torch.randperm(n, generator=g)[: b * blocks_per_seq].reshape(b, blocks_per_seq).to(torch.int32)
    return kc, vc, table


@pytest.mark.parametrize("block_size", [16, 64, 256])
def test_paged_append_then_attend(block_size):
    g = torch.Generator().manual_seed(block_size)
    b, s_q, hq, hk, d = 3, 4, 8, 2, 32
    kc, vc, table = _paged_cache(b, hk, d, block_size, 600 // block_size + 1, seed=block_size)
    q = torch.randn(b, s_q, hq, d, generator=g)
    k, v = torch.randn(b, s_q, hk, d, generator=g), torch.randn(b, s_q, hk, d, generator=g)
    lens = [0, 37, 500]
    want_o, want_lse, want_kc, want_vc = _expected(q, (kc, vc), (k, v), lens, table, scale=d**-0.5, right_bound=0)
    out, lse = flash_attn_with_kvcache(
        q,
        kc,
        vc,
        k=k,
        v=v,
        cache_seqlens=torch.tensor(lens, dtype=torch.int32),
        block_table=table,
        causal=True,
        return_softmax_lse=True,
    )
    assert torch.equal(kc, want_kc) and torch.equal(vc, want_vc)  # appended in place, nothing else touched
    assert torch.allclose(out.double(), want_o, atol=1e-5) and torch.allclose(lse.double(), want_lse, atol=1e-5)


def test_contiguous_cache_with_an_int_length_a_window_and_sinks():
    g = torch.Generator().manual_seed(1)
    b, hq, hk, d, cap = 2, 4, 4, 16, 64
    kc, vc = torch.randn(b, cap, hk, d, generator=g), torch.randn(b, cap, hk, d, generator=g)
    q = torch.randn(b, 2, hq, d, generator=g)
    k, v = torch.randn(b, 2, hk, d, generator=g), torch.randn(b, 2, hk, d, generator=g)
    sink = torch.randn(hq, generator=g)
    want_o, want_lse, want_kc, want_vc = _expected(
        q, (kc, vc), (k, v), [30, 30], None, scale=0.2, sink=sink, left_bound=9, right_bound=0
    )
    out, lse = flash_attn_with_kvcache(
        q,
        kc,
        vc,
        k=k,
        v=v,
        cache_seqlens=30,
        causal=True,
        window_size=(8, 0),
        softmax_scale=0.2,
        learnable_sink=sink,
        return_softmax_lse=True,
    )
    assert torch.equal(kc, want_kc) and torch.equal(vc, want_vc)
    assert torch.allclose(out.double(), want_o, atol=1e-5) and torch.allclose(lse.double(), want_lse, atol=1e-5)


def test_decode_over_the_cache_without_new_rows_and_the_plan_is_reused():
    g = torch.Generator().manual_seed(2)
    b, hq, hk, d, bs = 2, 4, 1, 16, 32
    kc, vc, table = _paged_cache(b, hk, d, bs, 4, seed=2)
    before = kc.clone()
    q = torch.randn(b, 1, hq, d, generator=g)
    for lens in ([1, 100], [128, 0]):
        want_o, *_ = _expected(q, (kc, vc), None, lens, table, scale=d**-0.5)
        out = flash_attn_with_kvcache(q, kc, vc, cache_seqlens=torch.tensor(lens, dtype=torch.int32), block_table=table)
        assert torch.allclose(out.double(), want_o, atol=1e-5)
        hits = plan_cache_info()["hits"]
    out = flash_attn_with_kvcache(q, kc, vc, cache_seqlens=torch.tensor([5, 6], dtype=torch.int32), block_table=table)
    assert plan_cache_info()["hits"] == hits + 1 and torch.equal(kc, before)


def test_bf16_paged_decode():
    g = torch.Generator().manual_seed(3)
    kc, vc, table = _paged_cache(2, 2, 64, 16, 8, seed=3)
    kc, vc = kc.bfloat16(), vc.bfloat16()
    q = torch.randn(2, 1, 4, 64, generator=g).bfloat16()
    k, v = torch.randn(2, 1, 2, 64, generator=g).bfloat16(), torch.randn(2, 1, 2, 64, generator=g).bfloat16()
    want_o, *_ = _expected(q, (kc, vc), (k, v), [10, 127], table, scale=0.125, right_bound=0)
    out = flash_attn_with_kvcache(
        q, kc, vc, k, v, cache_seqlens=torch.tensor([10, 127], dtype=torch.int32), block_table=table, causal=True
    )
    err = (out.double() - want_o).norm() / want_o.norm()
    assert out.dtype == torch.bfloat16 and err < 1e-2


@pytest.mark.parametrize(
    "kw, fragment",
    [
        (dict(rotary_cos=torch.zeros(1)), "rotary_cos"),
        (dict(block_table=torch.zeros(2, 4, dtype=torch.int64)), "block_table"),
        (dict(k=torch.zeros(2, 1, 2, 16), v=torch.zeros(2, 1, 2, 16)), "cache_seqlens"),
        (dict(k=torch.zeros(2, 1, 2, 16)), "new keys and values come together"),
        (dict(cache_batch_idx=torch.zeros(2, dtype=torch.int32)), "cache_batch_idx"),
        (dict(softcap=30.0), "softcap"),
    ],
)
def test_unserved_arguments_are_named(kw, fragment):
    q, kc, vc = torch.zeros(2, 1, 4, 16), torch.zeros(2, 32, 2, 16), torch.zeros(2, 32, 2, 16)
    with pytest.raises(UnsupportedArgumentError, match=fragment):
        flash_attn_with_kvcache(q, kc, vc, **kw)


# the append kernel ----------------------------------------------------------------------------------------------
TEMPLATE = "frost.engines.common.kv_append"
PARAMS = "frost.engines.common.kv_append_params.KvAppendParams"
CASES = [
    dict(dtype="bf16", head_dim=128, head_dim_v=128, paged=True, seqlens_tensor=True),
    dict(dtype="fp16", head_dim=64, head_dim_v=64, paged=False, seqlens_tensor=False),
    dict(dtype="bf16", head_dim=192, head_dim_v=128, paged=True, seqlens_tensor=False),
]


def test_append_kernel_name_says_what_it_writes():
    from frost.compiler.naming import check_symbol
    from frost.engines.common.kv_append import kernel_name
    from frost.engines.common.kv_append_params import KvAppendParams

    assert check_symbol(kernel_name(KvAppendParams(**CASES[0]), "sm_90a")) == "frost_kv_append_bf16_d128x128_paged_lens"


@pytest.mark.slow
def test_append_kernel_compiles_for_sm80_and_sm90a(tmp_path):
    from frost.engines.common.kv_append import kernel_name
    from frost.engines.common.kv_append_params import KvAppendParams

    archs = ("sm_80", "sm_90a")
    groups = [(arch, [(TEMPLATE, PARAMS, kw, None) for kw in CASES]) for arch in archs]
    for arch, outs in zip(archs, compile_groups(groups, tmp_path, ptxas=True)):
        for kw, out in zip(CASES, outs):
            name = kernel_name(KvAppendParams(**kw), arch)
            assert out["name"] == name and out["entries"] == [name], out
            assert out["target"] == [arch] and out["local"] == 0, out
            if out.get("ptxas") is not None:
                assert out["spill_bytes"] == 0, out
