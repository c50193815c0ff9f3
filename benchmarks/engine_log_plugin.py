"""A pytest plugin that records which frost engine served each test's executes (JSON lines in $ENGINE_LOG).

Used by benchmarks/cudnn_frontend_tests.sh to tell which of cuDNN-frontend's own tests ran on a DSL engine and which
on the cuDNN engine: `pytest -p engine_log_plugin ...` with this directory on PYTHONPATH.
"""

import json
import os

import frost

_execute = frost.Graph.execute


def _logged_execute(self, *args, **kwargs):
    out = _execute(self, *args, **kwargs)
    path = os.environ.get("ENGINE_LOG")
    if path:
        with open(path, "a") as f:
            f.write(
                json.dumps(
                    {
                        "test": os.environ.get("PYTEST_CURRENT_TEST", "").split(" ")[0],
                        "engine": getattr(self, "engine_name", None),
                    }
                )
                + "\n"
            )
    return out


frost.Graph.execute = _logged_execute
