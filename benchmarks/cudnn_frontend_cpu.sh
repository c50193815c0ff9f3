#!/usr/bin/env bash
# cuDNN-frontend's own SDPA tests on the CPU reference engine, through a `cudnn` package that is frost and nothing
# else (`cudnn/__init__.py`: `from frost import *`), with CUDA allocations and queries moved to the CPU by
# cpu_cuda_shim.py (a pytest plugin; the tests themselves are unchanged).
#   bash benchmarks/cudnn_frontend_cpu.sh CUDNN_FRONTEND_CHECKOUT OUT_DIR [pytest args, e.g. test_mhas_v2.py -k fwd]
# CUDNN_FRONTEND_CHECKOUT: a work tree or a git directory (its HEAD is read). Without pytest args it runs
# test_mhas_v2.py. The summary line is printed; the whole log is OUT_DIR/cudnn-tests.log.
set -uo pipefail
src="$1"; out="$2"; shift 2
here="$(cd "$(dirname "$0")" && pwd)"
work="$out/cudnn-tests"; alias="$out/alias"
mkdir -p "$work" "$alias/cudnn"
if [ -d "$src/test/python" ]; then
  cp -r "$src/test/python/." "$work/"
else
  git --git-dir="$src" archive HEAD test/python | tar -x -C "$out" && cp -r "$out/test/python/." "$work/"
fi
cat > "$alias/cudnn/__init__.py" <<'PY'
import frost as _frost
from frost import *  # noqa: F401,F403

__version__ = _frost.__version__


def __getattr__(name):
    return getattr(_frost, name)
PY
if ! python3 -c "import looseversion" 2>/dev/null; then
  cp "$here/looseversion_standin.py" "$alias/looseversion.py"
fi
[ $# -eq 0 ] && set -- test_mhas_v2.py
export PYTHONPATH="$alias:$here:$(cd "$here/.." && pwd):${PYTHONPATH:-}"
(cd "$work" && python3 -m pytest -p no:cacheprovider -p cpu_cuda_shim -rA -q "$@") > "$out/cudnn-tests.log" 2>&1
tail -1 "$out/cudnn-tests.log"
