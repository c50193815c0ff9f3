"""Runtime: workspace checks and carving, stream resolution, the execution context."""

from __future__ import annotations

import pytest
import torch

import frost
from frost.runtime.context import ExecutionContext, on_stream, stream_handle
from frost.runtime.workspace import ALIGN, ScratchBuffer, align_up, carve, check_workspace, layout_bytes
from test.helpers import Case, planned_fwd


def aligned_bytes(n: int, offset: int = 0) -> torch.Tensor:
    """A uint8 CPU tensor of n bytes whose address is `offset` past a 256-byte boundary."""
    base = torch.empty(n + 2 * ALIGN, dtype=torch.uint8)
    start = (-base.data_ptr()) % ALIGN + offset
    out = base[start : start + n]
    assert out.data_ptr() % ALIGN == offset
    return out


# --- workspace checks ----------------------------------------------------------------------------------------


def test_no_workspace_needed_accepts_anything():
    check_workspace(None, 0)
    check_workspace(torch.empty(3, dtype=torch.float32), 0)


@pytest.mark.parametrize(
    "make, fragment",
    [
        (lambda: None, "needs a workspace of 1024 bytes; got None"),
        (lambda: aligned_bytes(1000), "workspace too small: this plan needs 1024 bytes, got 1000"),
        (lambda: torch.empty(256, dtype=torch.float32), "contiguous uint8 tensor, got torch.float32"),
        (lambda: aligned_bytes(4096)[::2], "(contiguous=False)"),
        (lambda: bytearray(2048), "must be a torch.Tensor of uint8, got bytearray"),
        (lambda: aligned_bytes(2048, offset=1), "must be 256-byte aligned"),
        (lambda: aligned_bytes(2048, offset=128), "must be 256-byte aligned"),
    ],
)
def test_workspace_errors(make, fragment):
    with pytest.raises(frost.WorkspaceError) as ei:
        check_workspace(make(), 1024, device=torch.device("cpu"))
    assert fragment in str(ei.value)


def test_workspace_on_the_wrong_device():
    ws = torch.empty(2048, dtype=torch.uint8, device="meta")
    with pytest.raises(frost.WorkspaceError, match="workspace is on meta, the plan's tensors are on cpu"):
        check_workspace(ws, 1024, device=torch.device("cpu"))


def test_workspace_error_is_a_value_error():
    assert issubclass(frost.WorkspaceError, ValueError) and issubclass(frost.WorkspaceError, frost.FrostError)


def _planned_graph():
    g, pack, _, _ = planned_fwd(Case(batch=1, hq=2, hkv=2, sq=4, skv=4, d=8))
    return g, pack


def test_execute_checks_the_workspace_a_plan_needs(monkeypatch):
    from frost.adapters.reference import SdpaFwdReference

    monkeypatch.setattr(SdpaFwdReference, "scratch_workspace_bytes", lambda self: 512)
    g, pack = _planned_graph()
    assert g.get_workspace_size() == 512
    with pytest.raises(frost.WorkspaceError, match="needs a workspace of 512 bytes; got None"):
        g.execute(pack, None)
    with pytest.raises(frost.WorkspaceError, match="too small"):
        g.execute(pack, aligned_bytes(256))
    with pytest.raises(frost.WorkspaceError, match="256-byte aligned"):
        g.execute(pack, aligned_bytes(512, offset=16))
    with pytest.raises(frost.WorkspaceError, match="workspace is on meta"):
        g.execute(pack, torch.empty(512, dtype=torch.uint8, device="meta"))
    g.execute(pack, aligned_bytes(512))


def test_execute_without_workspace_when_none_is_needed():
    g, pack = _planned_graph()
    assert g.get_workspace_size() == 0
    g.execute(pack)
    g.execute(pack, None, ExecutionContext(stream=None))
    g.execute(pack, torch.empty(0, dtype=torch.uint8))


# --- carving ---------------------------------------------------------------------------------------------------

BUFFERS = [
    ScratchBuffer("acc", "float32", (3, 5)),
    ScratchBuffer("lse", "float32", (1,)),
    ScratchBuffer("sem", "int32", (64,)),
    ScratchBuffer("half", "bfloat16", (2, 129)),
    ScratchBuffer("bytes", "uint8", (300,)),
]


def test_scratch_sizes_and_layout_bytes():
    assert [b.nbytes for b in BUFFERS] == [60, 4, 256, 516, 300]
    assert layout_bytes(BUFFERS) == 256 + 256 + 256 + 768 + 512
    assert (align_up(0), align_up(1), align_up(256), align_up(257)) == (0, 256, 256, 512)
    assert layout_bytes([]) == 0


def test_carve_gives_aligned_views_into_the_same_storage():
    ws = aligned_bytes(layout_bytes(BUFFERS) + 100)
    views = carve(ws, BUFFERS)
    assert list(views) == [b.name for b in BUFFERS]
    offsets = []
    for b in BUFFERS:
        view = views[b.name]
        assert view.shape == b.shape and view.dtype == getattr(torch, b.dtype)
        assert view.untyped_storage().data_ptr() == ws.untyped_storage().data_ptr()
        off = view.data_ptr() - ws.data_ptr()
        assert off % ALIGN == 0 and view.data_ptr() % ALIGN == 0
        offsets.append(off)
    assert offsets == [0, 256, 512, 768, 1536]
    # views do not overlap and writes land in the workspace itself
    ws.zero_()
    views["sem"].fill_(-1)
    assert torch.all(ws[512:768] == 255) and torch.all(ws[:512] == 0) and torch.all(ws[768:] == 0)
    views["bytes"].fill_(7)
    assert torch.all(ws[1536:1836] == 7)


def test_carve_checks_the_workspace():
    with pytest.raises(frost.WorkspaceError, match="too small"):
        carve(aligned_bytes(layout_bytes(BUFFERS) - 1), BUFFERS)
    with pytest.raises(frost.WorkspaceError, match="got None"):
        carve(None, BUFFERS)
    assert carve(None, []) == {}


# --- streams -----------------------------------------------------------------------------------------------


class TorchLikeStream:
    def __init__(self, handle):
        self.cuda_stream = handle


class CUstreamLike:
    """What cuda.bindings' CUstream offers: int() gives the handle."""

    def __init__(self, handle):
        self._h = handle

    def __int__(self):
        return self._h


class PtrStream:
    def __init__(self, handle):
        self._h = handle

    def getPtr(self):
        return self._h


@pytest.mark.skipif(torch.cuda.is_available(), reason="None is torch's current stream on a GPU machine")
def test_none_is_the_default_stream_without_cuda():
    assert stream_handle(None) == 0


@pytest.mark.parametrize(
    "stream, want",
    [
        (0, 0),
        (1, 0),
        (2, 2),
        (0x7F00DEAD, 0x7F00DEAD),
        (2**48 + 16, 2**48 + 16),
        (TorchLikeStream(0), 0),
        (TorchLikeStream(0x1234), 0x1234),
        (TorchLikeStream(1), 0),
        (CUstreamLike(0), 0),
        (CUstreamLike(1), 0),
        (CUstreamLike(0xABC0), 0xABC0),
        (PtrStream(0x5550), 0x5550),
    ],
)
def test_stream_handles(stream, want):
    assert stream_handle(stream) == want


def test_real_custream_if_installed():
    driver = pytest.importorskip("cuda.bindings.driver")
    assert stream_handle(driver.CUstream(0x4000)) == 0x4000
    assert stream_handle(driver.CUstream(0)) == 0


@pytest.mark.parametrize(
    "stream, exc",
    [
        (-1, ValueError),
        (True, TypeError),
        (False, TypeError),
        ("7", TypeError),
        ("stream", TypeError),
        (1.5, TypeError),
        (object(), TypeError),
        ([3], TypeError),
        (CUstreamLike(-5), ValueError),
        (TorchLikeStream(-2), ValueError),
    ],
)
def test_bad_streams(stream, exc):
    with pytest.raises(exc):
        stream_handle(stream)


def test_execution_context_defaults_and_cpu_streams():
    ctx = ExecutionContext()
    assert ctx.stream is None and ctx.handle is None
    with on_stream(12345, torch.device("cpu")):  # torch work on CPU ignores the stream
        pass


def test_dense_scratch_views_are_reused_and_released_with_the_workspace():
    """The backward adapter re-carves scratch views only when the workspace changes, and holds
    no view (so no workspace memory) once the caller's workspace tensor is gone."""
    import gc

    from frost.adapters.dsl_bwd import DslBwdAdapter
    from frost.runtime.workspace import CarvedViews, ScratchBuffer

    a = DslBwdAdapter.__new__(DslBwdAdapter)
    a._dense_views = CarvedViews([ScratchBuffer("acc", "float32", (4, 8)), ScratchBuffer("sem", "int32", (3,))])
    ws = aligned_bytes(2048)
    first = a._scratch_views(ws, {})
    assert first["acc"].data_ptr() == ws.data_ptr() and first["sem"].data_ptr() == ws.data_ptr() + 256
    assert a._scratch_views(ws, {}) is first
    other = aligned_bytes(2048)
    views = a._scratch_views(other, {})
    assert views is not first and views["acc"].data_ptr() == other.data_ptr()
    del views, first, other
    gc.collect()
    assert not a._dense_views.held


def test_packed_tensors_below_their_envelope_bind_on_the_fast_path(monkeypatch):
    """THD tensors holding fewer tokens than declared are legal and common: no detailed check per call."""
    from frost.runtime import binding

    case = Case(thd=True, batch=2, hq=2, hkv=2, d=8, lens_q=(3, 5), lens_kv=(4, 2), extra_q=4, extra_kv=4)
    g, pack, _, _ = planned_fwd(case)
    small = dict(pack)
    for role, decl, *_ in g._binder.specs:
        if role in binding.THD_Q_ROLES:
            small[decl] = pack[decl][:8]
        elif role in binding.THD_KV_ROLES:
            small[decl] = pack[decl][:6]

    def no_detailed_check(role, *a, **k):
        raise AssertionError(f"{role} took the slow path")

    monkeypatch.setattr(binding, "check_tensor", no_detailed_check)
    bound = g._binder.bind(small, None)
    assert bound["q"].shape[0] == 8 and bound["k"].shape[0] == 6
