"""Save a built plan to one file; load it into a graph in a fresh process without compiling.

Saving records the facts, engine, requested knobs, target and every kernel
artifact the plan launches (frost.plans.plan_file). Loading checks that the
graph's facts equal the saved ones, adopts the artifacts into the cache when
this frost would have compiled exactly them (same fingerprint, same arch), and
builds the plan for the saved engine and knobs: the compile boundary then finds
every kernel on disk. A file from another frost build or arch still loads: its
kernels compile, with a warning, as does any kernel that could not be adopted,
and so do the kernels of a file that another user owns or that group or others
may write (the cache's rule, `frost.compiler.trust`): its native code is never
loaded.
"""

from __future__ import annotations

import time
import warnings
from pathlib import Path

from frost.compiler import cache, fingerprint
from frost.compiler.artifacts import Artifact, adopt, export_kernel, prune_keeping, sha256, stale_reason
from frost.compiler.compile import KernelSpec
from frost.errors import GraphError, NotSupportedError, PlanFileError, PlanFileWarning
from frost.plans import plan_file
from frost.plans.plan_file import KernelRecord, PlanHeader
from frost.version import __version__


def _warn(msg: str) -> None:
    warnings.warn(f"frost plan file: {msg}", PlanFileWarning, stacklevel=2)


# -- save -------------------------------------------------------------------------------------
def _record(i: int, art: Artifact) -> KernelRecord:
    j = art.spec.to_json()
    return KernelRecord(
        name=art.symbol,
        template=art.spec.template,
        params_type=j["params_type"],
        params=j["params"],
        arch=art.arch,
        key=art.key,
        member=f"kernels/{i}.o",
        size=len(art.obj),
        sha256=art.digest,
        so_member=f"kernels/{i}.so" if art.so is not None else None,
        so_sha256=sha256(art.so) if art.so is not None else None,
        so_size=len(art.so) if art.so is not None else None,
        runtime_libs=list(art.runtime_libs),
        kernel_symbols=list(art.kernel_symbols),
    )


def save_plan(graph, path) -> Path:
    """Write `graph`'s built plan and the artifacts of every kernel it launches to `path` (one file)."""
    graph._require_plan()
    plan = graph.plan
    try:
        arts = [export_kernel(ck) for ck in plan.adapter.compiled_kernels()]
    except OSError as e:
        raise PlanFileError(f"cannot save the plan of graph {graph.name!r}: {e}") from None
    header = PlanHeader(
        frost_version=__version__,
        created=time.time(),
        graph=graph.name,
        engine=plan.engine_name,
        knobs=plan.adapter.knobs.requested(),
        target=graph.target.model_dump(),
        arch=graph.target.arch,
        fingerprint=fingerprint.fingerprint(),
        fingerprint_inputs=fingerprint.fingerprint_inputs(),
        facts=plan.facts.model_dump(mode="json"),
        workspace_size=plan.workspace_size,
        kernels=[_record(i, a) for i, a in enumerate(arts)],
    )
    return plan_file.write(path, header, [(a.obj, a.so) for a in arts])


# -- load -------------------------------------------------------------------------------------
def _diff(saved: dict, here: dict, prefix: str = "") -> list[str]:
    """Differing keys; a tensor's `label` (the user's name, for errors only) is never one of them."""
    out = []
    for k in sorted(set(saved) | set(here), key=str):
        if k == "label":
            continue
        a, b = saved.get(k), here.get(k)
        if a != b:
            out.append(f"{prefix}{k}: saved {a!r}, here {b!r}")
    return out


def facts_differences(saved: dict, here: dict) -> list[str]:
    """Human-readable differences between two facts records (as JSON dicts); tensors are matched by role."""
    out = _diff({k: v for k, v in saved.items() if k != "tensors"}, {k: v for k, v in here.items() if k != "tensors"})
    st = {t["name"]: t for t in saved.get("tensors", [])}
    ht = {t["name"]: t for t in here.get("tensors", [])}
    for role in sorted(set(st) | set(ht)):
        if role not in ht:
            out.append(f"tensor {role}: in the saved plan only")
        elif role not in st:
            out.append(f"tensor {ht[role].get('label') or role}: not in the saved plan")
        else:
            out += _diff(st[role], ht[role], f"tensor {ht[role].get('label') or role} ")
    return out


def _check_facts(graph, header: PlanHeader, path) -> None:
    from frost.ir.facts import SdpaFacts

    if graph.facts is None:
        graph.validate()
    try:
        saved = SdpaFacts.model_validate(header.facts).model_dump(mode="json")
    except ValueError as e:
        raise PlanFileError(f"plan file {path}: its facts record does not parse here ({e})") from None
    diffs = facts_differences(saved, graph.facts.model_dump(mode="json"))
    if diffs:
        raise PlanFileError(
            f"plan file {path} was saved for a different graph than {graph.name!r}: "
            + "; ".join(diffs[:8])
            + (f"; and {len(diffs) - 8} more" if len(diffs) > 8 else "")
        )


def _fingerprint_reason(header: PlanHeader) -> str:
    here = fingerprint.fingerprint_inputs()
    keys = [
        k for k in sorted(set(here) | set(header.fingerprint_inputs)) if here.get(k) != header.fingerprint_inputs.get(k)
    ]
    parts = []
    for k in keys:
        a, b = header.fingerprint_inputs.get(k), here.get(k)
        if isinstance(a, dict) and isinstance(b, dict):
            parts += [f"{k}.{n}" for n in sorted(set(a) | set(b)) if a.get(n) != b.get(n)]
        else:
            parts.append(k)
    return ", ".join(parts) or "fingerprint"


def _artifact(rec: KernelRecord, obj: bytes, so) -> Artifact:
    spec = KernelSpec.from_json({"template": rec.template, "params_type": rec.params_type, "params": rec.params})
    return Artifact(spec, rec.arch, rec.key, rec.name, obj, so, list(rec.runtime_libs), list(rec.kernel_symbols))


def _adopt_all(graph, header: PlanHeader, blobs, path, untrusted=None) -> bool:
    """Put the saved kernels where the compile boundary will find them; False when they cannot serve here."""
    if not header.kernels:
        return True
    if untrusted is not None:  # the cache's ownership rule: native code only from the user's own files
        _warn(f"{untrusted}; its kernels are not loaded and compile here")
        return False
    if header.fingerprint != fingerprint.fingerprint():
        _warn(
            f"{path} was saved by another frost build (differs in {_fingerprint_reason(header)}); "
            "its kernels are not used and compile here"
        )
        return False
    arch = graph.target.arch
    if header.arch != arch:
        _warn(
            f"{path} was saved for {header.arch} ({header.target.get('name', '?')}); "
            f"{graph.target.name} compiles for {arch}, so its kernels compile here"
        )
        return False
    ids, complete = [], True
    for rec, (obj, so) in zip(header.kernels, blobs):
        try:
            art = _artifact(rec, obj, so)
            reason = stale_reason(art)
            if reason is None:
                ids.append(adopt(art))
        except Exception as e:  # noqa: BLE001 - an artifact that cannot be adopted compiles instead
            reason = f"kernel {rec.name} could not be adopted ({type(e).__name__}: {e})"
        if reason is not None:
            _warn(f"{path}: {reason}; it compiles here")
            complete = False
    prune_keeping(ids)
    return complete


def _compiles() -> int:
    s = cache.stats()
    return s["compiles"] + s["worker_compiles"]


def _build(graph, header: PlanHeader) -> None:
    try:
        graph.build_plans(engine=header.engine, knobs=header.knobs)
    except (NotSupportedError, GraphError) as e:
        first = str(e).splitlines()[0]
        _warn(
            f"engine {header.engine} with knobs {header.knobs} cannot plan graph {graph.name!r} on "
            f"{graph.target.name} ({first}); ranking the engines afresh"
        )
        graph.build_plans(knobs={})


def load_plan(graph, path):
    """Build `graph`'s plan from a saved plan file: the saved engine and knobs, with the saved kernels.

    The graph must declare what the saved one did (equal facts), else PlanFileError
    (a GraphError) lists the differences. Returns the graph.
    """
    header, blobs, untrusted = plan_file.read(path)
    _check_facts(graph, header, path)
    adopted = _adopt_all(graph, header, blobs, path, untrusted)
    before = _compiles()
    _build(graph, header)
    compiled = _compiles() - before
    if adopted and compiled:
        _warn(f"{compiled} kernel(s) of {path} could not be loaded and were compiled")
    names = graph.plan.adapter.kernel_names()
    saved = [k.name for k in header.kernels]
    if adopted and graph.plan.engine_name == header.engine and names != saved:
        _warn(f"the plan built here launches {names}, the saved one {saved}")
    return graph
