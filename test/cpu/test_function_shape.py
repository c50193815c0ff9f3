"""Function shape: no function over 150 lines, none over 16 parameters except a `@cute.kernel` entry (whose
parameters are the launch's tensors). Long argument lists grow a parameter per feature; records and per-step
functions keep them short (see `frost/engines/common/turns.py` and the kernels' records)."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TREES = ("frost", "tools", "benchmarks", "test")
MAX_LINES = 150
MAX_PARAMS = 16

#: functions that keep a longer signature, each with its reason (qualified name -> why)
ALLOWED = {
    # the cuDNN frontend's own signatures, keyword for keyword: the public graph API mirrors them
    "frost/ir/graph.py:OpGraph.sdpa": "cuDNN's pygraph.sdpa keywords",
    "frost/ir/graph.py:OpGraph.sdpa_backward": "cuDNN's pygraph.sdpa_backward keywords",
    # FlashAttention's private backward signature, which the torch face serves positionally
    "frost/torch_face/provider.py:flash_backward": "flash_attn's _flash_attn_backward positional signature",
    "frost/torch_face/kvcache.py:flash_attn_with_kvcache": "flash_attn's flash_attn_with_kvcache keywords",
    "frost/torch_face/flash.py:flash_attn_varlen_func": "flash_attn's flash_attn_varlen_func keywords",
    # not folded yet: a GPU test's launch helper, one keyword per case knob (18)
    "test/gpu/test_sm80_fwd_kernel.py:run_case": "one keyword per case knob (to fold)",
}


def _params(fn: ast.FunctionDef) -> int:
    a = fn.args
    names = [x.arg for x in a.posonlyargs + a.args + a.kwonlyargs]
    n = len(names) + (a.vararg is not None) + (a.kwarg is not None)
    return n - (1 if names and names[0] in ("self", "cls") else 0)


def _is_kernel_entry(fn: ast.FunctionDef) -> bool:
    return any(ast.unparse(d).split("(")[0].endswith("cute.kernel") for d in fn.decorator_list)


def _functions(path: Path):
    """(qualified name, node) of every function in a file, methods as Class.method."""
    tree = ast.parse(path.read_text(), filename=str(path))

    def walk(node, prefix):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                yield f"{prefix}{child.name}", child
                yield from walk(child, f"{prefix}{child.name}.")
            elif isinstance(child, ast.ClassDef):
                yield from walk(child, f"{prefix}{child.name}.")
            else:
                yield from walk(child, prefix)

    yield from walk(tree, "")


def shape_offenders(root: Path = ROOT) -> dict:
    """{path:qualified name: (lines, parameters)} of every function over either limit."""
    out = {}
    for tree in TREES:
        for path in sorted((root / tree).rglob("*.py")):
            rel = path.relative_to(root).as_posix()
            for name, fn in _functions(path):
                lines, params = fn.end_lineno - fn.lineno + 1, _params(fn)
                if lines > MAX_LINES or (params > MAX_PARAMS and not _is_kernel_entry(fn)):
                    out[f"{rel}:{name}"] = (lines, params)
    return out


def test_no_function_is_too_long_or_takes_too_many_parameters():
    found = shape_offenders()
    over = {k: v for k, v in found.items() if k not in ALLOWED}
    assert not over, "functions over 150 lines or 16 parameters ((lines, parameters)): " + ", ".join(
        f"{k} {v}" for k, v in sorted(over.items())
    )
    stale = sorted(set(ALLOWED) - set(found))
    assert not stale, f"allowed functions that now fit, drop them from ALLOWED: {stale}"


def test_the_shape_check_catches_a_long_function_and_a_long_signature(tmp_path):
    (tmp_path / "frost").mkdir()
    body = "\n".join(f"    x{i} = {i}" for i in range(MAX_LINES))
    params = ", ".join(f"a{i}" for i in range(MAX_PARAMS + 1))
    (tmp_path / "frost" / "m.py").write_text(
        f"def long():\n{body}\n\n\nclass C:\n    def wide(self, {params}):\n        pass\n\n"
        f"    def fits(self, {', '.join(f'a{i}' for i in range(MAX_PARAMS))}):\n        pass\n\n\n"
        f"@cute.kernel\ndef entry({params}):\n    pass\n"
    )
    assert shape_offenders(tmp_path) == {
        "frost/m.py:long": (MAX_LINES + 1, 0),
        "frost/m.py:C.wide": (2, MAX_PARAMS + 1),
    }
