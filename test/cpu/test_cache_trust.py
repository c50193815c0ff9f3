"""The kernel cache loads native code only from directories the user owns and nobody else can write to.

Planted directories (owned by another user, or group-writable) make frost warn once through the `frost` logger
and compile without the disk layer; a sidecar cannot choose the libraries frost opens; cache files are private
whatever the umask; a nearly full disk costs one compile per kernel, not two.
"""

from __future__ import annotations

import logging
import os
import stat
from pathlib import Path

import pytest

from frost.compiler import cache, loader
from frost.compiler import compile as boundary
from frost.engines.common.probe_copy_params import ProbeCopyParams

PROBE = "frost.engines.common.probe_copy"
ARCH = "sm_90a"
ROOT = Path(__file__).resolve().parents[2]
NOBODY = 65534


def _needs_root():
    if os.geteuid() != 0:
        pytest.skip("planting a directory owned by another user needs chown (root)")


def _compile(dtype="f32"):
    return boundary.compile_kernel(PROBE, ProbeCopyParams(dtype=dtype), ARCH)


def _frost_warnings(caplog):
    return [r.getMessage() for r in caplog.records if r.name == "frost" and r.levelno == logging.WARNING]


def test_directories_are_0700_and_files_not_group_writable_whatever_the_umask(fresh):
    old = os.umask(0o002)
    try:
        ck = _compile()
    finally:
        os.umask(old)
    assert ck.source == "compile" and ck.path
    dc = cache.disk()
    for d in (dc.root, dc.base, dc.dir):
        assert stat.S_IMODE(d.stat().st_mode) == 0o700, d
    files = [p for p in dc.dir.iterdir() if p.is_file()]
    assert any(p.suffix == ".o" for p in files)
    for p in files:
        assert not p.stat().st_mode & 0o022, f"{p.name} mode {stat.S_IMODE(p.stat().st_mode):o}"


@pytest.mark.parametrize(
    "plant",
    [
        "root owned by nobody",
        "fingerprint dir owned by nobody",
        "group-writable root",
        "group-writable fingerprint dir",
    ],
)
def test_untrusted_cache_warns_once_and_never_loads_its_entries(fresh, caplog, plant):
    first = _compile()  # a valid entry on disk
    assert first.source == "compile"
    dc = cache.disk()
    target = dc.root if plant.endswith("root") else dc.dir
    if "nobody" in plant:
        _needs_root()
        os.chown(target, NOBODY, NOBODY)
    else:
        os.chmod(target, 0o770)
    cache._disk.clear()  # a new process's view
    boundary.clear_memo()
    cache.reset_stats()
    caplog.set_level(logging.WARNING, logger="frost")
    again = _compile()
    assert again.source == "compile" and again.path is None  # compiled, the planted entry never loaded
    s = cache.stats()
    assert s["hits"] == 0 and s["compiles"] == 1
    _compile("f16")
    warnings = _frost_warnings(caplog)
    assert len(warnings) == 1, warnings  # once
    if "nobody" in plant:
        want = f"frost cache: directory {target}: it is owned by uid {NOBODY}, not by this user (uid 0)"
    else:
        want = f"frost cache: directory {target} is writable by group or others (mode 770)"
    assert warnings[0].startswith(want), warnings[0]
    assert "compiling without the disk cache" in warnings[0]
    described = cache.describe()
    assert described["enabled"] is False and described["off_reason"].startswith(want[len("frost cache: ") :])


def test_a_sidecar_cannot_choose_the_libraries_frost_opens(fresh, tmp_path):
    ck = _compile()
    side = Path(ck.path).with_suffix(".json")
    planted = tmp_path / "evil" / loader.DSL_RUNTIME
    planted.parent.mkdir()
    planted.write_bytes(b"not a library, and never opened")
    meta = cache.Sidecar.model_validate_json(side.read_bytes())
    side.write_text(meta.model_copy(update={"runtime_libs": [str(planted)]}).model_dump_json())
    assert loader.runtime_libs_for([str(planted)]) is None
    boundary.clear_memo()
    again = _compile()
    assert again.source == "disk"
    assert str(planted) not in loader._global_libs and os.path.realpath(planted) not in loader._global_libs
    if ck.loader == "so":  # the linked library exists: it was not loaded through the planted path
        assert again.loader == "o"


def test_runtime_libraries_come_from_frosts_own_list():
    allowed = loader.allowed_runtime_libraries()
    assert allowed and all(os.path.isabs(p) for p in allowed)
    shipped = [p for p in allowed if os.path.basename(p) == loader.DSL_RUNTIME]
    assert shipped, "the installed CuTe DSL ships its runtime"
    assert loader.runtime_libs_for([shipped[0]])[0] == shipped[0]
    assert loader.runtime_libs_for(["/tmp/x/" + loader.DSL_RUNTIME]) is None


def test_a_malformed_sidecar_is_a_miss_named_by_field(fresh):
    ck = _compile()
    side = Path(ck.path).with_suffix(".json")
    side.write_text('{"format": 1, "symbol": 3}')
    with pytest.raises(Exception) as ei:
        cache.Sidecar.model_validate_json(side.read_bytes())
    assert "fingerprint" in str(ei.value) and "symbol" in str(ei.value)
    boundary.clear_memo()
    cache.reset_stats()
    assert _compile().source == "compile" and cache.stats()["corrupt"] >= 1


def test_a_full_disk_compiles_each_kernel_once(fresh, monkeypatch, caplog):
    monkeypatch.setattr(cache, "MIN_FREE_BYTES", 1 << 62)  # no file system has that much free
    caplog.set_level(logging.WARNING, logger="frost")
    a, b = _compile("f32"), _compile("f16")
    assert a.source == b.source == "compile" and a.path is None and b.path is None
    assert cache.stats()["compiles"] == 2
    warnings = _frost_warnings(caplog)
    assert len(warnings) == 1 and "OSError" in warnings[0] and "MiB free" in warnings[0], warnings


def test_default_location_is_the_users_cache_dir(monkeypatch, tmp_path):
    monkeypatch.delenv("FROST_CACHE_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache.cache_dir() == tmp_path / "xdg" / "frost"
    monkeypatch.setenv("XDG_CACHE_HOME", "relative/ignored")
    assert cache.cache_dir() == Path.home() / ".cache" / "frost"
    monkeypatch.delenv("XDG_CACHE_HOME")
    assert cache.cache_dir() == Path.home() / ".cache" / "frost"


def test_device_run_script_uses_no_fixed_name_in_the_shared_temp_dir():
    text = (ROOT / "benchmarks" / "device_run.sh").read_text()
    assert "/tmp/" not in text and "mktemp -d" in text
    assert "FROST_CACHE_DIR=" not in text  # the caller's, or frost's per-user default


def test_nothing_is_created_until_an_entry_is_written_and_a_dir_planted_meanwhile_is_refused(fresh):
    dc = cache.disk()
    assert dc is not None and not fresh.exists()  # looking creates nothing (frost info stays side-effect free)
    _needs_root()
    fresh.mkdir(mode=0o700)
    os.chown(fresh, NOBODY, NOBODY)  # planted after disk() looked
    with pytest.raises(OSError, match=f"owned by uid {NOBODY}"):
        dc.ensure()
    assert not dc.dir.exists() or dc.dir.stat().st_uid == 0


def test_cute_dsl_libs_from_the_environment_count_as_frosts_own(monkeypatch, tmp_path):
    lib = tmp_path / loader.DSL_RUNTIME
    lib.write_bytes(b"")
    monkeypatch.setenv("CUTE_DSL_LIBS", f"/nonexistent/x.so{os.pathsep}{lib}")
    assert os.path.realpath(lib) in loader.allowed_runtime_libraries()
    assert loader.runtime_libs_for([str(lib)])[0] == os.path.realpath(lib)
