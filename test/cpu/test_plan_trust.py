"""Plan files: only frost's own record types are named (nothing else is imported), a member's declared size is
checked before it is inflated, and bundled native code follows the cache's ownership rule."""

from __future__ import annotations

import json
import os
import sys
import types
import zipfile
from pathlib import Path

import pytest
import torch

import frost
from frost.compiler import cache, fingerprint
from frost.compiler import compile as boundary
from frost.compiler.artifacts import export_kernel
from frost.engines.common.probe_copy_params import ProbeCopyParams
from frost.errors import PlanFileError
from frost.plans import plan_file, plan_io, precompile
from frost.plans.plan_file import PlanHeader
from frost.target import CPU

PROBE = "frost.engines.common.probe_copy"
PROBE_PARAMS_TYPE = "frost.engines.common.probe_copy_params:ProbeCopyParams"
ARCH = "sm_90a"
NOBODY = 65534


def _ref_plan(tmp_path) -> Path:
    g = frost.Graph(io_data_type=torch.float32, target=CPU, name="g")
    q, k, v = (g.tensor(name=n, dim=(1, 2, 8, 16)) for n in ("q", "k", "v"))
    o, st = g.sdpa(q, k, v, attn_scale=0.25, generate_stats=True)
    o.set_output(True)
    st.set_output(True)
    g.validate().build_plans()
    return Path(g.save_plan(tmp_path / "ref.plan"))


def _rewrite(src: Path, dst: Path, update=None, members=None) -> Path:
    with zipfile.ZipFile(src) as z:
        header = json.loads(z.read("plan.json"))
    if update:
        update(header)
    with zipfile.ZipFile(dst, "w", compression=zipfile.ZIP_DEFLATED) as z:
        z.writestr("plan.json", json.dumps(header))
        for n, data in (members or {}).items():
            z.writestr(n, data)
    return dst


def _kernel(**kw) -> dict:
    rec = {
        "name": "frost_x",
        "template": PROBE,
        "params_type": PROBE_PARAMS_TYPE,
        "params": {},
        "arch": ARCH,
        "key": {},
        "member": "kernels/0.o",
        "size": 1,
        "sha256": "0" * 64,
    }
    rec.update(kw)
    return rec


@pytest.mark.parametrize(
    "field,value,text",
    [
        (
            "params_type",
            "this:X",
            "kernels.0.params_type: Value error, 'this:X' is not a frost params type (frost.engines.<module>:<Class>)",
        ),
        (
            "template",
            "this",
            "kernels.0.template: Value error, 'this' is not a frost kernel template module (frost.engines.<module>)",
        ),
    ],
)
def test_a_plan_naming_a_foreign_module_is_refused_without_importing_it(tmp_path, field, value, text):
    sys.modules.pop("this", None)
    bad = _rewrite(
        _ref_plan(tmp_path),
        tmp_path / "bad.plan",
        lambda h: h.update(kernels=[_kernel(**{field: value})]),
        {"kernels/0.o": b"x"},
    )
    with pytest.raises(PlanFileError) as ei:
        plan_file.read(bad)
    assert str(ei.value) == f"plan file {bad} has a malformed header ({text})"
    assert "this" not in sys.modules


def test_a_member_declaring_more_than_its_record_is_refused_before_inflating(tmp_path, monkeypatch):
    big = b"\0" * (8 << 20)  # deflates to a few KiB
    bad = _rewrite(
        _ref_plan(tmp_path), tmp_path / "bomb.plan", lambda h: h.update(kernels=[_kernel(size=1)]), {"kernels/0.o": big}
    )
    assert bad.stat().st_size < 64 << 10
    inflated = []
    real_read = zipfile.ZipFile.read
    monkeypatch.setattr(
        zipfile.ZipFile, "read", lambda self, name, pwd=None: (inflated.append(name), real_read(self, name, pwd))[1]
    )
    with pytest.raises(PlanFileError) as ei:
        plan_file.read(bad)
    assert str(ei.value) == (
        f"plan file {bad}: member kernels/0.o declares {8 << 20} bytes, more than the 1 its "
        f"record allows (corrupt or hostile file); nothing was inflated"
    )
    assert inflated == ["plan.json"]


def _probe_plan(tmp_path) -> tuple[Path, object]:
    """A plan file carrying one real kernel (the probe copy, compiled for sm_90a), written by this user."""
    ck = boundary.compile_kernel(PROBE, ProbeCopyParams(dtype="f32"), ARCH)
    art = export_kernel(ck)
    rec = plan_io._record(0, art)
    header = PlanHeader(
        frost_version=frost.__version__,
        created=0.0,
        graph="g",
        engine="x",
        knobs={},
        target={},
        arch=ARCH,
        fingerprint=fingerprint.fingerprint(),
        fingerprint_inputs=fingerprint.fingerprint_inputs(),
        facts={},
        workspace_size=0,
        kernels=[rec],
    )
    path = plan_file.write(tmp_path / "probe.plan", header, [(art.obj, art.so)])
    return path, art


def _adopted(path) -> tuple[bool, list, bool]:
    """(whether the kernels were adopted, warnings, whether the cache now holds the kernel)."""
    header, blobs, untrusted = plan_file.read(path)
    graph = types.SimpleNamespace(target=types.SimpleNamespace(arch=ARCH, name="H200"), name="g")
    with _Warnings() as w:
        ok = plan_io._adopt_all(graph, header, blobs, path, untrusted)
    rec = header.kernels[0]
    held = cache.disk().lookup(rec.key)[0] is not None
    return ok, w.messages, held


class _Warnings:
    def __enter__(self):
        import warnings

        self._cm = warnings.catch_warnings(record=True)
        self._caught = self._cm.__enter__()
        warnings.simplefilter("always")
        return self

    def __exit__(self, *exc):
        self.messages = [str(w.message) for w in self._caught]
        return self._cm.__exit__(*exc)


@pytest.mark.parametrize("plant", ["owned by nobody", "group-writable", "other-writable"])
def test_native_code_of_a_plan_file_follows_the_caches_ownership_rule(fresh, tmp_path, plant):
    path, art = _probe_plan(tmp_path)
    if plant == "owned by nobody":
        if os.geteuid() != 0:
            pytest.skip("chown to another user needs root")
        os.chown(path, NOBODY, NOBODY)
        why = f"file {path}: it is owned by uid {NOBODY}, not by this user (uid 0)"
    else:
        os.chmod(path, 0o664 if plant == "group-writable" else 0o646)
        why = f"file {path} is writable by group or others (mode {'664' if plant == 'group-writable' else '646'})"
    cache.clear()  # the compile above published the kernel: start from an empty cache
    assert plan_file.read(path).untrusted == why
    ok, warnings, held = _adopted(path)
    assert not ok and not held, "native code from an untrusted plan file reached the cache"
    assert warnings == [f"frost plan file: {why}; its kernels are not loaded and compile here"]


def test_a_plan_file_of_ones_own_is_adopted(fresh, tmp_path):
    path, art = _probe_plan(tmp_path)
    os.chmod(path, 0o644)
    cache.clear()
    assert plan_file.read(path).untrusted is None
    ok, warnings, held = _adopted(path)
    assert ok and held and warnings == []


def test_a_spec_file_naming_a_foreign_module_is_refused_naming_the_field(tmp_path):
    sys.modules.pop("this", None)
    f = tmp_path / "specs.json"
    f.write_text(json.dumps([{"template": PROBE, "params_type": "this:X", "params": {}}]))
    with pytest.raises(ValueError) as ei:
        precompile.main(["--spec-file", str(f), "--arch", ARCH])
    assert "params_type" in str(ei.value) and "'this:X' is not a frost params type" in str(ei.value)
    assert "this" not in sys.modules
    f.write_text(json.dumps([{"template": PROBE, "params_type": PROBE_PARAMS_TYPE, "params": {"dtype": "f64"}}]))
    with pytest.raises(ValueError, match="dtype"):
        precompile.main(["--spec-file", str(f), "--arch", ARCH])
