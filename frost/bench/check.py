"""Output checks: relative error against the reference, and unwritten (NaN-poisoned) elements."""

from __future__ import annotations

DEFAULT_TOL = {"fwd": 1e-2, "bwd": 2e-2}


def rel_err(out, ref) -> float:
    """||out - ref|| / ||ref|| in float32 (inf when shapes differ or out is not finite)."""
    import torch

    if tuple(out.shape) != tuple(ref.shape):
        return float("inf")
    a, b = out.float(), ref.float()
    if not bool(torch.isfinite(a).all()):
        return float("inf")
    den = torch.linalg.vector_norm(b).item()
    num = torch.linalg.vector_norm(a - b).item()
    if den == 0.0:
        return 0.0 if num == 0.0 else float("inf")
    return num / den


def compare(outs, refs) -> float:
    """Worst relative error over matching output tuples ((o,) or (dq, dk, dv))."""
    if len(outs) != len(refs):
        return float("inf")
    return max(rel_err(o, r) for o, r in zip(outs, refs))


def unwritten(outs) -> int:
    """How many elements are still NaN after a poisoned run."""
    import torch

    return int(sum(int(torch.isnan(t).sum().item()) for t in outs))


def choose_reference(outs_by_impl: dict, order, tol: float):
    """(key, outs, notes): the check reference among peers' outputs, in preference order.

    A peer whose output is not finite cannot judge others. When two or more finite
    peers ran, the reference is the first that another one agrees with (relative
    error within `tol`): one library's wrong answer (e.g. a nested-tensor path that
    returns finite garbage) must not fail everyone else. No agreeing pair: key None,
    and the caller falls back to the float32 math. `notes` say why a peer was passed over.
    """
    import torch

    notes = {}
    finite = {}
    for k in order:
        if k not in outs_by_impl:
            continue
        if all(bool(torch.isfinite(t).all()) for t in outs_by_impl[k]):
            finite[k] = outs_by_impl[k]
        else:
            notes[k] = "output not finite; not used as the check reference"
    if len(finite) <= 1:
        k = next(iter(finite), None)
        return k, finite.get(k), notes
    for k, outs in finite.items():
        if any(compare(other, outs) <= tol for j, other in finite.items() if j != k):
            return k, outs, notes
        notes[k] = "no other peer agrees with its output; not used as the check reference"
    return None, None, notes
