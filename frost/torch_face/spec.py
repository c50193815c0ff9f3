"""What a torch-face call specializes on, and how its mask maps onto frost's graph keywords.

The specialization is everything a plan's kernels depend on (dtype, head dims and counts, mask,
sinks, packing, layout class, arch, determinism, scale, whether the forward writes lse) and never
batch, lengths or totals; two calls that differ only in those share their compiled kernels (each
exact shape still has its own plan, see `plans.py`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

from frost.errors import UnsupportedArgumentError


@dataclass(frozen=True)
class Band:
    """A mask in FlashAttention's window convention, relative to the aligned diagonal.

    Query row i keeps key j when ``i + off - left <= j <= i + off + right``; a negative bound is
    unbounded; ``off`` is ``len_kv - len_q`` when `bottom_right`, else 0. Causal is ``right = 0``.
    """

    left: int = -1
    right: int = -1
    bottom_right: bool = False

    def graph_keywords(self) -> dict:
        """frost's `sdpa` keywords: L = left + 1 keeps j > i + off - L; R = right keeps j <= i + off + R."""
        kw = {}
        if self.left >= 0:
            kw["diagonal_band_left_bound"] = self.left + 1
        if self.right >= 0:
            kw["diagonal_band_right_bound"] = self.right
        if self.bottom_right and kw:
            kw["diagonal_alignment"] = "BOTTOM_RIGHT"
        return kw


_BANDS: dict = {}  # (causal, window, alignment, causal_wins) -> Band, for hashable windows


def band(causal: bool, window=None, diagonal_alignment: str = "top_left", *, causal_wins: bool = False) -> Band:
    """The Band of a call's `causal` flag, `window=(left, right)` (None or negative: unbounded) and alignment.

    `causal` sets the right bound to 0. A window whose right bound is positive contradicts it: an
    error, unless `causal_wins` (FlashAttention's rule: causal overrides the right bound).
    """
    try:
        key = (causal, window, diagonal_alignment, causal_wins)
        hit = _BANDS.get(key)
    except TypeError:  # a list window: not hashable
        return _band(causal, window, diagonal_alignment, causal_wins)
    if hit is None:
        hit = _band(causal, window, diagonal_alignment, causal_wins)
        if len(_BANDS) < 1024:
            _BANDS[key] = hit
    return hit


def _band(causal, window, diagonal_alignment, causal_wins) -> Band:
    align = str(diagonal_alignment).lower()
    if align not in ("top_left", "bottom_right"):
        raise ValueError(f"diagonal_alignment must be 'top_left' or 'bottom_right', got {diagonal_alignment!r}")
    left, right = _window(window)
    if causal:
        if right > 0 and not causal_wins:
            raise ValueError(
                f"causal=True keeps no key right of the diagonal, but window={tuple(window)} asks for "
                f"{right}; pass causal=False with the window, or a right bound of 0 or -1"
            )
        right = 0
    return Band(left=left, right=right, bottom_right=align == "bottom_right")


def _window(window) -> tuple[int, int]:
    if window is None:
        return -1, -1
    try:
        left, right = window
    except (TypeError, ValueError):
        raise ValueError(f"window must be (left, right), got {window!r}") from None
    return (-1 if left is None or left < 0 else int(left)), (-1 if right is None or right < 0 else int(right))


def check_scale(scale) -> Optional[float]:
    """`scale` as a float (None stays None: 1/sqrt(D)); anything else is a ValueError that names it."""
    if scale is None or (type(scale) is float and math.isfinite(scale)):
        return scale
    if not isinstance(scale, bool):
        try:
            value = float(scale)
        except (TypeError, ValueError):
            pass
        else:
            if math.isfinite(value):
                return value
    raise ValueError(f"scale must be a finite number (or None for 1/sqrt(head_dim)), got {scale!r}")


def default_scale(head_dim: int, scale: Optional[float]) -> float:
    return 1.0 / math.sqrt(head_dim) if scale is None else check_scale(scale)


def stride_order(t) -> tuple[int, ...]:
    """A tensor's layout class: its axes from the slowest to the fastest stride (ties keep axis order)."""
    st = t.stride()
    return tuple(sorted(range(len(st)), key=lambda a: (-st[a], a)))


@dataclass(frozen=True)
class Specialization:
    """The key of what a plan compiles: equal keys share kernels; batch and lengths never enter it."""

    direction: str  # "fwd" | "bwd"
    dtype: str
    head_dim_qk: int
    head_dim_v: int
    heads_q: int
    heads_kv: int
    band: Band
    has_sinks: bool
    packed: bool
    layouts: tuple  # stride order of each io tensor, in role order
    arch: str
    deterministic: bool
    scale: float
    has_stats: bool = True  # False: an eager forward whose lse nobody sees (no Stats port, no lse written)


def specialization(
    direction: str,
    q,
    k,
    v,
    *,
    band: Band,
    sinks,
    packed: bool,
    arch: str,
    scale: Optional[float],
    deterministic: bool = False,
    extra=(),
    has_stats: bool = True,
) -> Specialization:
    """The Specialization of a call; `extra` are further io tensors (out, dout) whose layout class counts.

    Heads are dim 1 of dense (B, H, S, D) and packed (T, H, D) tensors alike.
    """
    return Specialization(
        direction=direction,
        dtype=str(q.dtype).replace("torch.", ""),
        head_dim_qk=int(q.shape[-1]),
        head_dim_v=int(v.shape[-1]),
        heads_q=int(q.shape[1]),
        heads_kv=int(k.shape[1]),
        band=band,
        has_sinks=sinks is not None,
        packed=packed,
        layouts=tuple(stride_order(t) for t in (q, k, v, *extra)),
        arch=arch,
        deterministic=bool(deterministic) and direction == "bwd",
        scale=default_scale(int(q.shape[-1]), scale),
        has_stats=has_stats or direction == "bwd",
    )


def reject(name: str, value, why: str = "") -> None:
    """Raise the error that names an argument value frost does not serve."""
    raise UnsupportedArgumentError(f"frost does not serve {name}={value!r}{': ' + why if why else ''}")
