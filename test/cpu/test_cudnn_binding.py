"""The cuDNN engine's lowering against the real nvidia-cudnn-frontend binding, on a machine without a GPU.

frost's cuDNN lowering record is replayed through `frost.adapters.cudnn.build_cudnn_graph` into the installed
binding's `cudnn.pygraph` (1.32's is pure Python), checked by its Python-native SDPA validator, lowered to its C++
graph and validated there: every keyword name, value type (pybind takes a float scale, int bounds, a
(float, tensor, tensor) dropout tuple), output declaration and uid the engine sends is parsed by the real binding.
No GPU and no libcudnn are needed: a stub library answering only `cudnnGetVersion` stands in for libcudnn (the
graph is told sm_version=90, so nothing asks a device). It runs in a subprocess, so the stub never reaches this
test process.

Skipped where the binding is not installed (`pip install --no-deps nvidia-cudnn-frontend==1.32.0` brings it to a
CPU machine), where no C compiler builds the stub, or where a real libcudnn loads (the GPU tests exercise that).
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

STUB_C = """
#include <stddef.h>
size_t cudnnGetVersion(void) { return 91500; }
size_t cudnnGetCudartVersion(void) { return 13000; }
const char *cudnnGetErrorString(int status) { (void)status; return "stub"; }
"""

SCRIPT = r'''
import ctypes, glob, json, os, sys, sysconfig

# where the binding looks for libcudnn (its _dlopen_cudnn): a real one means a GPU machine, which the GPU tests cover
found = glob.glob(os.path.join(sysconfig.get_path("purelib"), "nvidia", "cudnn*", "lib", "libcudnn.so*"))
for name in ("libcudnn.so.9", "libcudnn.so"):
    try:
        ctypes.CDLL(name)
        found.append(name)
    except OSError:
        pass
if found:
    print(json.dumps({"skip": f"a real libcudnn is installed here ({found[0]}); the GPU tests exercise it"}))
    sys.exit(0)

import cudnn

stub = ctypes.CDLL(sys.argv[1])
cudnn._pybind_module._set_dlhandle_cudnn(ctypes.cast(stub._handle, ctypes.c_void_p).value)

import frost
from cudnn._sdpa_validate import validate_graph
from frost.adapters.cudnn import build_cudnn_graph, ordered_uids
from frost.adapters.cudnn_lowering import lower_cudnn_sdpa
from frost.target import fake_target

H200 = fake_target("H200")
BSHD = (128 * 4 * 64, 64, 4 * 64, 1)


def packed(direction, extra, **kw):
    """frost's packed form: (T, H, D) tensors, cu_seq_len (B+1,), token-major Stats (T, H, 1)."""
    g = frost.Graph(io_data_type="bf16", target=H200)
    cq, ck = (g.tensor(name=n, dim=(3,), data_type="int32") for n in ("cu_q", "cu_kv"))
    q, k, v = (g.tensor(name=n, dim=(256, 4, 64)) for n in "qkv")
    kw.update(cu_seq_len_q=cq, cu_seq_len_kv=ck, max_seq_len_q=128, max_seq_len_kv=128, attn_scale=0.125)
    if direction == "fwd":
        o, st = g.sdpa(q, k, v, generate_stats=True, **kw)
        o.set_output(True)
        st.set_output(True)
    else:
        o, do = (g.tensor(name=n, dim=(256, 4, 64)) for n in ("o", "dO"))
        st = g.tensor(name="stats", dim=(256, 4, 1), data_type="fp32")
        for t in g.sdpa_backward(q, k, v, o, do, st, **kw):
            t.set_output(True)
    return g.validate()


def ragged(direction, extra, **kw):
    """cuDNN's ragged form declared directly: (B, H, S, D) with bshd strides over packed tokens, offsets, lengths."""
    g = frost.Graph(io_data_type="bf16", target=H200)
    off = g.tensor(name="off", dim=(3, 1, 1, 1), stride=(1, 1, 1, 1), data_type="int64")
    off_st = g.tensor(name="off_st", dim=(3, 1, 1, 1), stride=(1, 1, 1, 1), data_type="int32")
    lq, lk = (g.tensor(name=n, dim=(2, 1, 1, 1), stride=(1, 1, 1, 1), data_type="int32") for n in ("lq", "lk"))
    q, k, v = (g.tensor(name=n, dim=(2, 4, 128, 64), stride=BSHD, ragged_offset=off) for n in "qkv")
    kw.update(use_padding_mask=True, seq_len_q=lq, seq_len_kv=lk, attn_scale=0.125)
    st_stride = (128 * 4, 1, 4, 1)
    if direction == "fwd":
        o, st = g.sdpa(q, k, v, generate_stats=True, **kw)
        o.set_output(True).set_stride(BSHD).set_ragged_offset(off)
        st.set_output(True).set_stride(st_stride).set_ragged_offset(off_st)
    else:
        o, do = (g.tensor(name=n, dim=(2, 4, 128, 64), stride=BSHD, ragged_offset=off) for n in ("o", "dO"))
        st = g.tensor(name="stats", dim=(2, 4, 128, 1), stride=st_stride, data_type="fp32", ragged_offset=off_st)
        for t in g.sdpa_backward(q, k, v, o, do, st, **kw):
            t.set_output(True).set_stride(BSHD).set_ragged_offset(off)
    return g.validate()


def paged(direction, extra, *, block_size=32, table_transposed=True, sink=False, **kw):
    """cuDNN's paged cache, as its paged tests declare it: K/V containers (num_blocks, H_kv, block_size, D), int32
    tables (B, 1, max_blocks, 1) with a transposed tensor's strides, the envelope, the padding mask's lengths."""
    g = frost.Graph(io_data_type="bf16", target=H200)
    q = g.tensor(name="q", dim=(2, 4, 16, 64), stride=(4096, 64, 256, 1))
    blocks = -(-128 // block_size)
    k, v = (g.tensor(name=n, dim=(2 * blocks + 3, 2, block_size, 64)) for n in ("container_k", "container_v"))
    stride = (1, 2 * blocks, 2, 1) if table_transposed else (blocks, blocks, 1, 1)
    kt, vt = (g.tensor(name=n, dim=(2, 1, blocks, 1), stride=stride, data_type="int32") for n in ("kt", "vt"))
    lq, lk = (g.tensor(name=n, dim=(2, 1, 1, 1), stride=(1, 1, 1, 1), data_type="int32") for n in ("lq", "lk"))
    if sink:
        kw["sink_token"] = g.tensor(name="sink", dim=(4,), data_type="fp32")
    o, st = g.sdpa(q, k, v, generate_stats=kw.pop("generate_stats", True), attn_scale=0.125, use_padding_mask=True,
                   seq_len_q=lq, seq_len_kv=lk, paged_attention_k_table=kt, paged_attention_v_table=vt,
                   paged_attention_max_seq_len_kv=128, **kw)
    o.set_output(True)
    if st is not None:
        st.set_output(True)
    return g.validate()


def graph(direction, extra, **kw):
    if extra in ("packed", "ragged", "paged"):
        return {"packed": packed, "ragged": ragged, "paged": paged}[extra](direction, extra, **kw)
    g = frost.Graph(io_data_type="bf16", target=H200)
    q, k, v = (g.tensor(name=n, dim=(2, 4, 128, 64), stride=BSHD) for n in "qkv")
    kw.update(EXTRA[extra](g) if extra else {})
    if direction == "fwd":
        o, st = g.sdpa(q, k, v, attn_scale=0.125, generate_stats=kw.pop("generate_stats", True), **kw)
        o.set_output(True)
        if st is not None:
            st.set_output(True)
    else:
        o, do = (g.tensor(name=n, dim=(2, 4, 128, 64), stride=BSHD) for n in ("o", "dO"))
        st = g.tensor(name="stats", dim=(2, 4, 128, 1), data_type="fp32")
        for t in g.sdpa_backward(q, k, v, o, do, st, attn_scale=0.125, **kw):
            t.set_output(True)
    return g.validate()


EXTRA = {
    "bias": lambda g: {"bias": g.tensor(name="bias", dim=(1, 4, 128, 128))},
    "bias_dbias": lambda g: {"bias": g.tensor(name="bias", dim=(1, 4, 128, 128)),
                             "dBias": g.tensor(name="db", dim=(1, 4, 128, 128))},
    "dropout": lambda g: {"dropout": (0.2, g.tensor(name="seed", dim=(1,), data_type="int64"),
                                      g.tensor(name="offset", dim=(1, 1, 1, 1), data_type="int64"))},
    "dropout_dump": lambda g: {"dropout": (0.1, g.tensor(name="seed", dim=(1, 1, 1, 1), data_type="int64"),
                                           g.tensor(name="offset", dim=(1, 1, 1, 1), data_type="int64")),
                               "rng_dump": g.tensor(name="rng_dump", dim=(2, 4, 128, 128), data_type="fp32")},
    "padding": lambda g: {"use_padding_mask": True, "seq_len_q": g.tensor(name="lq", dim=(2,), data_type="int32"),
                          "seq_len_kv": g.tensor(name="lkv", dim=(2, 1, 1, 1), data_type="int32")},
    "sink": lambda g: {"sink_token": g.tensor(name="sink", dim=(4,), data_type="fp32")},
    "sink_dsink": lambda g: {"sink_token": g.tensor(name="sink", dim=(4,), data_type="fp32"),
                             "dSink_token": g.tensor(name="dsink", dim=(4,), data_type="fp32")},
    "row_stats": lambda g: {r: g.tensor(name=r, dim=(2, 4, 128, 1), data_type="fp32")
                            for r in ("score_max", "score_sum_exp")},
}


def lower(g):
    """(cuDNN pygraph, its tensors by role, roles, the lowered C++ graph, C++ validate's verdict)."""
    call = lower_cudnn_sdpa(g.facts)
    cg, ts = build_cudnn_graph(cudnn, call, None)
    for node in cg._nodes:
        node.infer_properties(cg._context)
    if validate_graph(cg) is not True:
        raise AssertionError("1.32's SDPA validator did not cover the graph")
    for t in cg._tensors.values():
        t.validate()
    cg._cpp_graph_kwargs["sm_version"] = 90  # no device is asked
    cg._backend_handle_for_lowering = lambda kw: 1  # never used: nothing below executes
    lowered = cg._lower_to_cpp()
    lowered.validate()
    return cg, ts, call.roles(), lowered


results = {}
for name, (direction, extra, kw) in json.loads(sys.argv[2]).items():
    try:
        cg, ts, roles, lowered = lower(graph(direction, extra, **kw))
        node = cg._nodes[0]
        uids = ordered_uids(cg, ts, roles)
        offsets = {role: int(ts[role].ragged_offset.uid) for role in roles
                   if getattr(ts[role], "ragged_offset", None) is not None}
        results[name] = {"ok": True, "inputs": sorted(node.inputs), "outputs": sorted(node.outputs),
                         "offsets": offsets, "roles": list(roles),
                         "params": {k: (v.name if hasattr(v, "name") else v) for k, v in node.params.items()},
                         "uids": list(uids) if uids is not None else None,
                         "role_uids": [int(ts[r].get_uid()) for r in roles],
                         "cpp_uids": sorted(int(t.get_uid()) for t in cg._cpp_tensors.values())}
    except Exception as e:
        results[name] = {"ok": False, "error": f"{type(e).__name__}: {e}"}
print(json.dumps(results))
'''

CASES = {
    "fwd": ("fwd", None, {}),
    "fwd no stats": ("fwd", None, {"generate_stats": False}),
    "fwd causal": ("fwd", None, {"use_causal_mask": True}),
    "fwd causal bottom-right": ("fwd", None, {"use_causal_mask_bottom_right": True}),
    "fwd causal window": ("fwd", None, {"use_causal_mask": True, "sliding_window_length": 32}),
    "fwd band": ("fwd", None, {"diagonal_band_left_bound": 16, "diagonal_band_right_bound": 4}),
    "fwd bottom-right window": ("fwd", None, {"diagonal_alignment": "BOTTOM_RIGHT", "sliding_window_length": 16}),
    "fwd bias": ("fwd", "bias", {}),
    "fwd bias causal": ("fwd", "bias", {"use_causal_mask": True}),
    "fwd dropout": ("fwd", "dropout", {}),
    "fwd dropout rng_dump": ("fwd", "dropout_dump", {"use_causal_mask": True}),
    "fwd padding causal": ("fwd", "padding", {"use_causal_mask": True}),
    "fwd sinks": ("fwd", "sink", {"use_causal_mask": True}),
    "fwd alibi": ("fwd", None, {"use_alibi_mask": True, "use_causal_mask": True}),
    "fwd score_max score_sum_exp": ("fwd", "row_stats", {"generate_stats": False, "use_causal_mask": True}),
    "fwd stats score_max score_sum_exp": ("fwd", "row_stats", {}),
    "bwd": ("bwd", None, {}),
    "bwd causal deterministic": ("bwd", None, {"use_causal_mask": True, "use_deterministic_algorithm": True}),
    "bwd bias dbias": ("bwd", "bias_dbias", {}),
    "bwd dropout": ("bwd", "dropout", {}),
    "bwd dropout rng_dump": ("bwd", "dropout_dump", {}),
    "bwd padding": ("bwd", "padding", {}),
    "bwd sinks dsink": ("bwd", "sink_dsink", {"use_causal_mask": True}),
    "bwd causal window": ("bwd", None, {"use_causal_mask": True, "sliding_window_length": 32}),
    "fwd packed causal": ("fwd", "packed", {"use_causal_mask": True}),
    "bwd packed causal": ("bwd", "packed", {"use_causal_mask": True}),
    "fwd ragged form": ("fwd", "ragged", {}),
    "bwd ragged form": ("bwd", "ragged", {"use_causal_mask": True}),
    "fwd paged": ("fwd", "paged", {}),
    "fwd paged decode bottom-right causal": (
        "fwd",
        "paged",
        {"use_causal_mask_bottom_right": True, "generate_stats": False},
    ),
    "fwd paged window": ("fwd", "paged", {"use_causal_mask_bottom_right": True, "sliding_window_length": 64}),
    "fwd paged sinks": ("fwd", "paged", {"use_causal_mask_bottom_right": True, "sink": True}),
    "fwd paged block 128": ("fwd", "paged", {"block_size": 128, "table_transposed": False}),
    # a graph cuDNN's own validation refuses: proves the C++ validate above is live
    "refused: bottom-right causal with bias": ("fwd", "bias", {"use_causal_mask_bottom_right": True}),
}


def _frontend_version() -> tuple:
    from importlib.metadata import PackageNotFoundError, version

    from frost.adapters.cudnn import frontend_version

    try:
        return frontend_version(version("nvidia-cudnn-frontend"))
    except PackageNotFoundError:
        return ()


@pytest.fixture(scope="module")
def lowered(tmp_path_factory):
    if importlib.util.find_spec("cudnn") is None:
        pytest.skip("nvidia-cudnn-frontend is not installed (pip install --no-deps nvidia-cudnn-frontend==1.32.0)")
    from frost.adapters.cudnn import MIN_FRONTEND

    if _frontend_version() < MIN_FRONTEND:
        pytest.skip(f"nvidia-cudnn-frontend {_frontend_version()} is older than {MIN_FRONTEND}")
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler for the libcudnn stub")
    d = tmp_path_factory.mktemp("cudnn_stub")
    (d / "stub.c").write_text(STUB_C)
    lib = d / "libcudnn_stub.so"
    subprocess.run([cc, "-shared", "-fPIC", "-o", str(lib), str(d / "stub.c")], check=True, capture_output=True)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    env.pop("LD_LIBRARY_PATH", None)  # the binding would load a libcudnn found there
    r = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(lib), json.dumps(CASES)],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert r.returncode == 0, r.stderr[-4000:]
    out = json.loads(r.stdout.strip().splitlines()[-1])
    if "skip" in out:
        pytest.skip(out["skip"])
    return out


@pytest.mark.parametrize("name", [n for n in CASES if not n.startswith("refused")])
def test_the_binding_takes_every_call_the_engine_makes(lowered, name):
    res = lowered[name]
    assert res["ok"], res.get("error")
    # every role the engine binds at execute is an operand of the lowered graph, in the order it passes them
    assert res["uids"] == res["role_uids"] and len(set(res["uids"])) == len(res["uids"])
    assert set(res["uids"]) <= set(res["cpp_uids"])


def test_masks_reach_the_binding_in_its_preferred_keywords(lowered):
    p = lowered["fwd causal window"]["params"]
    assert p["diagonal_alignment"] == "TOP_LEFT" and p["diagonal_band_right_bound"] == 0
    assert p["diagonal_band_left_bound"] == 32 and "use_causal_mask" not in p
    assert lowered["fwd causal bottom-right"]["params"]["diagonal_alignment"] == "BOTTOM_RIGHT"
    assert lowered["fwd no stats"]["outputs"] == ["O"] and lowered["fwd"]["outputs"] == ["O", "Stats"]
    assert lowered["fwd dropout"]["params"]["dropout_0"] == 0.2
    assert {"dropout_1", "dropout_2"} <= set(lowered["bwd dropout"]["inputs"])
    assert "dBias" in lowered["bwd bias dbias"]["outputs"] and "dSink_token" in lowered["bwd sinks dsink"]["outputs"]
    assert lowered["bwd causal deterministic"]["params"]["use_deterministic_algorithm"] is True


@pytest.mark.parametrize("name", ["fwd dropout rng_dump", "bwd dropout rng_dump"])
def test_the_dropout_mask_dump_reaches_the_binding_as_an_output(lowered, name):
    """rng_dump goes to cuDNN beside the (probability, seed, offset) dropout, as the op's output the engine binds."""
    res = lowered[name]
    assert res["ok"], res.get("error")
    assert "rng_dump" in res["roles"] and {"dropout_1", "dropout_2"} <= set(res["inputs"])
    assert any(o.lower() == "rng_dump" for o in res["outputs"]), res["outputs"]
    assert res["params"]["dropout_0"] == 0.1


def test_cudnns_own_validation_is_live(lowered):
    res = lowered["refused: bottom-right causal with bias"]
    assert not res["ok"] and "cudnnGraphNotSupportedError" in res["error"] and "Bottom right" in res["error"]


@pytest.mark.parametrize("name", ["fwd packed causal", "bwd packed causal", "fwd ragged form", "bwd ragged form"])
def test_packed_graphs_reach_the_binding_in_its_ragged_form(lowered, name):
    """Every packed tensor carries a ragged offset the binding knows as an operand; the lengths are the padding
    mask's; the packed totals are the op's envelopes."""
    res = lowered[name]
    assert res["ok"], res.get("error")
    io = (
        ("q", "k", "v", "o", "stats")
        if name.startswith("fwd")
        else ("q", "k", "v", "o", "dO", "stats", "dQ", "dK", "dV")
    )
    assert set(res["offsets"]) == set(io)
    role_uid = dict(zip(res["roles"], res["role_uids"]))
    assert set(res["offsets"].values()) <= set(role_uid.values()) <= set(res["cpp_uids"])
    assert {"SEQ_LEN_Q", "SEQ_LEN_KV"} <= {i.upper() for i in res["inputs"]}
    p = res["params"]
    assert p["use_padding_mask"] is True and p["max_total_seq_len_q"] == 256 and p["max_total_seq_len_kv"] == 256
    if "packed" in name:  # one offset array per (token group, token stride): q/o/... share one, stats its own
        assert res["offsets"]["q"] == res["offsets"]["o"] != res["offsets"]["stats"]
        assert res["offsets"]["k"] == res["offsets"]["v"] != res["offsets"]["q"]


@pytest.mark.parametrize("name", [n for n in CASES if "paged" in n])
def test_paged_caches_reach_the_binding_as_its_paged_sdpa(lowered, name):
    """The containers are K and V, the tables are the op's page-table operands, the envelope is a parameter."""
    res = lowered[name]
    assert res["ok"], res.get("error")
    assert {"paged_attention_k_table", "paged_attention_v_table", "seq_len_q", "seq_len_kv"} <= set(res["inputs"])
    assert res["params"]["paged_attention_max_seq_len_kv"] == 128 and res["params"]["use_padding_mask"] is True
    assert {"paged_attention_k_table", "paged_attention_v_table"} <= set(res["roles"])
