"""frost's ragged-offsets kernel (packed graphs on the cuDNN engine): its params, scratch layout and name, and its
compile for sm_80, sm_90a and sm_100a (no GPU needed; each arch in its own process, PTX kept)."""

from __future__ import annotations

import pytest

from frost.engines.common.ragged_offsets_params import (
    INT32_MAX,
    RaggedOffsetsParams,
    offset_dtype_for,
    offset_role,
    scratch_buffers,
    validate,
)
from frost.errors import TemplateParamsError
from test.compile_runner import compile_groups

TEMPLATE = "frost.engines.common.ragged_offsets"
PARAMS = "frost.engines.common.ragged_offsets_params.RaggedOffsetsParams"
CASES = [
    dict(offset_dtype="int32", strides_q=(512, 4), strides_kv=(256,)),
    dict(offset_dtype="int64", strides_q=(1024,), strides_kv=(128, 2048)),
]


def test_offsets_are_int32_until_an_offset_passes_it():
    assert offset_dtype_for(INT32_MAX) == "int32" and offset_dtype_for(INT32_MAX + 1) == "int64"


def test_params_need_a_stride_per_group():
    validate(RaggedOffsetsParams(strides_q=(4,), strides_kv=(4,)))
    for bad in (dict(strides_q=(), strides_kv=(4,)), dict(strides_q=(4,), strides_kv=(0,))):
        with pytest.raises(TemplateParamsError):
            validate(RaggedOffsetsParams(**bad))


def test_scratch_rows_are_256_byte_aligned():
    p = RaggedOffsetsParams(offset_dtype="int64", strides_q=(512, 4), strides_kv=(256,))
    lengths, offsets = scratch_buffers(p, batch=70)
    assert lengths.shape == (2, 128) and lengths.dtype == "int32"  # 70 int32 -> two 256-byte blocks per row
    assert offsets.shape == (3, 96) and offsets.dtype == "int64"  # 71 int64 -> three blocks per row
    assert scratch_buffers(p, batch=1)[1].shape == (3, 32)
    assert offset_role(2) == "ragged_offset_2"


def test_kernel_name_says_what_it_writes():
    from frost.compiler.naming import check_symbol
    from frost.engines.common.ragged_offsets import kernel_name

    name = kernel_name(RaggedOffsetsParams(**CASES[0]), "sm_90a")
    assert check_symbol(name) == "frost_ragged_offsets_int32_q512x4_kv256"


@pytest.mark.slow
def test_compiles_for_sm80_sm90a_sm100a(tmp_path):
    from frost.engines.common.ragged_offsets import kernel_name

    archs = ("sm_80", "sm_90a", "sm_100a")
    groups = [(arch, [(TEMPLATE, PARAMS, kw, None) for kw in CASES]) for arch in archs]
    for arch, outs in zip(archs, compile_groups(groups, tmp_path)):
        for kw, out in zip(CASES, outs):
            name = kernel_name(RaggedOffsetsParams(**kw), arch)
            assert out["name"] == name and out["entries"] == [name], out
            assert out["target"] == [arch] and out["local"] == 0, out
