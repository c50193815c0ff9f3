"""Every import in frost points down the layer order; nothing outside test/ imports a test module.

Imports are read from the source with `ast`, wherever they sit: module level,
inside functions (the lazy ones that keep `import frost` cheap), and dotted
module paths in strings (kernel templates and adapters load by path through
importlib). A new folder under frost/ must be given a layer here.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

# The layer order, lowest first: a module may import its own layer and the layers before it.
LAYERS: list[tuple[str, tuple[str, ...]]] = [
    ("records", ("frost.types", "frost.errors", "frost.knobs", "frost.target", "frost.version")),
    ("ir", ("frost.ir",)),
    ("runtime", ("frost.runtime",)),
    ("engines", ("frost.engines",)),
    ("compiler", ("frost.compiler",)),
    ("adapters", ("frost.adapters",)),
    ("lowering", ("frost.lowering",)),
    ("plans", ("frost.plans",)),
    ("graph", ("frost.graph",)),
    ("public", ("frost", "frost.cache", "frost.kv_append")),  # "frost" is the package root alone, not a prefix
    ("torch_face", ("frost.torch_face",)),
    ("distributed", ("frost.distributed",)),  # context parallelism: a client of the torch face
    ("apps", ("frost.bench", "frost.cli", "frost.demo", "frost.testing")),
]
# Tighter than the order: the only modules some layers may import from frost.
ONLY: dict[str, tuple[str, ...]] = {
    "ir": ("frost.ir", "frost.types", "frost.errors"),  # the graph knows nothing below it
    # a client of the public graph API: the package's public names and the records they use
    "torch_face": (
        "frost",
        "frost.torch_face",
        "frost.errors",
        "frost.types",
        "frost.knobs",
        "frost.target",
        "frost.version",
        "frost.runtime",
        "frost.kv_append",
    ),
    # beyond torch.distributed, the public names and the torch face only
    "distributed": ("frost", "frost.torch_face", "frost.distributed"),
}
RANK = {name: i for i, (name, _) in enumerate(LAYERS)}
_DOTTED = re.compile(r"\b(?:frost|test)\b(?:\.[A-Za-z_]\w*)+(?::[A-Za-z_][\w.]*)?")


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def is_module(name: str) -> bool:
    p = ROOT.joinpath(*name.split("."))
    return p.with_suffix(".py").is_file() or (p / "__init__.py").is_file()


def longest_module(dotted: str) -> str:
    """The module a dotted path names: itself, or the longest module prefix of `pkg.mod.Attr`."""
    parts = dotted.split(":")[0].split(".")
    for n in range(len(parts), 0, -1):
        if is_module(".".join(parts[:n])):
            return ".".join(parts[:n])
    return parts[0]


def imports_of(path: Path) -> list[tuple[int, str]]:
    """(line, module) for every import in `path`: statements anywhere, importlib calls and dotted-path strings."""
    tree = ast.parse(path.read_text(), str(path))
    here = module_name(path)
    package = here if path.name == "__init__.py" else here.rpartition(".")[0]
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                pkg = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join(pkg + ([node.module] if node.module else []))
            # `from pkg import mod` imports the submodule when there is one
            out += [(node.lineno, f"{base}.{a.name}" if is_module(f"{base}.{a.name}") else base) for a in node.names]
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and _DOTTED.fullmatch(node.value):
            mod = longest_module(node.value)
            if mod.count(".") >= 1:
                out.append((node.lineno, mod))
    return sorted(set(out))


def layer_of(module: str) -> str:
    best, best_len = None, -1
    for name, prefixes in LAYERS:
        for p in prefixes:
            hit = module == p if p == "frost" else (module == p or module.startswith(p + "."))
            if hit and len(p) > best_len:
                best, best_len = name, len(p)
    if best is None:
        raise AssertionError(f"{module} belongs to no layer: give it one in LAYERS ({__file__})")
    return best


def sources(*folders: str) -> list[Path]:
    return sorted(p for f in folders for p in (ROOT / f).rglob("*.py") if "__pycache__" not in p.parts)


FROST = sources("frost")


def test_every_frost_module_has_a_layer():
    for p in FROST:
        layer_of(module_name(p))


def test_imports_point_down_the_layers():
    upward, outside = [], []
    for p in FROST:
        mod = module_name(p)
        layer = layer_of(mod)
        for line, target in imports_of(p):
            if target != "frost" and not target.startswith("frost."):
                continue
            where = f"{p.relative_to(ROOT)}:{line} ({layer}) imports {target}"
            if RANK[layer_of(target)] > RANK[layer]:
                upward.append(f"{where} ({layer_of(target)})")
            if not is_module(target):
                outside.append(f"{where}: no such module")
            only = ONLY.get(layer)
            # "frost" in a list is the package root alone, not a prefix (as in LAYERS)
            if only and not any(target == o or (o != "frost" and target.startswith(o + ".")) for o in only):
                outside.append(f"{where}: {layer} may import only {only}")
    assert not upward, "imports up the layer order:\n" + "\n".join(upward)
    assert not outside, "\n".join(outside)


def test_the_scan_sees_lazy_imports_and_dotted_paths():
    seen = {t for p in (ROOT / "frost/graph.py", ROOT / "frost/lowering/capabilities.py") for _, t in imports_of(p)}
    assert "frost.plans.plan_io" in seen  # inside a method
    assert "frost.adapters.sm80" in seen  # a dotted path in a capability row


@pytest.mark.parametrize("folder", ["frost", "tools", "benchmarks"])
def test_nothing_outside_tests_imports_a_test_module(folder):
    bad = [
        f"{p.relative_to(ROOT)}:{line} imports {t}"
        for p in sources(folder)
        for line, t in imports_of(p)
        if t == "test" or t.startswith("test.")
    ]
    assert not bad, "\n".join(bad)


def test_fingerprint_hashes_every_module_the_kernels_and_the_compiler_import():
    """A kernel's code may depend on any module its template or the compile boundary imports: each one is
    hashed into the cache fingerprint, or listed in fingerprint.NOT_CODEGEN with its reason."""
    from frost.compiler import fingerprint

    hashed = {p.resolve() for p in fingerprint.source_files()}
    exempt = {(fingerprint.FROST_ROOT / f).resolve() for f in fingerprint.NOT_CODEGEN}
    todo = [p for p in FROST if p.resolve() in hashed]
    assert todo and all(p.resolve() in hashed for p in sources("frost/engines", "frost/compiler"))
    missing, seen = [], set()
    while todo:
        p = todo.pop()
        for _, target in imports_of(p):
            if target != "frost" and not target.startswith("frost."):
                continue
            q = ROOT.joinpath(*target.split("."))
            q = (q / "__init__.py" if q.is_dir() else q.with_suffix(".py")).resolve()
            if q in seen:
                continue
            seen.add(q)
            if q in exempt:
                continue
            if q not in hashed:
                missing.append(f"{p.relative_to(ROOT)} imports {target}")
            todo.append(q)
    assert not missing, "not in the fingerprint's SOURCES:\n" + "\n".join(missing)


def test_context_parallel_talks_through_torch_distributed_only():
    """frost.distributed's transport is torch.distributed: no other communication package."""
    allowed = ("torch", "frost", "__future__", "contextlib", "dataclasses", "functools", "math", "typing")
    bad = [
        f"{p.relative_to(ROOT)}:{line} imports {t}"
        for p in sources("frost/distributed")
        for line, t in imports_of(p)
        if t.split(".")[0] not in allowed
    ]
    assert not bad, "\n".join(bad)
