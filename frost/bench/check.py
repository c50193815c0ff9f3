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
