#!/usr/bin/env bash
# cuDNN-frontend's own SDPA tests run against frost with only the import changed (`import cudnn` -> `import frost as
# cudnn`), each execute's engine logged (engine_log_plugin.py), then counted per engine.
#   bash benchmarks/cudnn_frontend_tests.sh CUDNN_FRONTEND_CHECKOUT OUT_DIR [pytest args, e.g. -n 14 -k "ragged1"]
# Copies test/python/{test_mhas,test_utils,conftest}.py and pytest.ini into OUT_DIR/cudnn-tests and runs there (with
# a stand-in for looseversion where it is not installed). Run on a GPU machine (the tests allocate on "cuda").
set -uo pipefail
src="$1"; out="$2"; shift 2
here="$(cd "$(dirname "$0")" && pwd)"
work="$out/cudnn-tests"; mkdir -p "$work"
for f in test_mhas.py test_utils.py conftest.py pytest.ini; do
  sed 's/^import cudnn$/import frost as cudnn/' "$src/test/python/$f" > "$work/$f"
done
# the tests compare version strings with looseversion; where it is not installed, a small stand-in does
if ! python3 -c "import looseversion" 2>/dev/null; then
  cp "$here/looseversion_standin.py" "$work/looseversion.py"
fi
export ENGINE_LOG="$out/engines.jsonl" PYTHONPATH="$here:$(cd "$here/.." && pwd):${PYTHONPATH:-}"
: > "$ENGINE_LOG"
(cd "$work" && python3 -m pytest -p no:cacheprovider -p engine_log_plugin test_mhas.py -rA -q "$@") > "$out/cudnn-tests.log" 2>&1
tail -1 "$out/cudnn-tests.log"
python3 - "$ENGINE_LOG" <<'PY'
import collections, json, sys
engines = collections.Counter()
for line in open(sys.argv[1]):
    engines[json.loads(line)["engine"]] += 1
print("executes per engine:", dict(engines))
PY
