"""Which key tiles a split-KV CTA walks: its piece of the band's key-tile range [n_min, n_max).

Computed on the device from the range the actual lengths give (never a plan-time count), so a replay with new
lengths cuts the new range. The host twin the CPU tests model the kernels with is
`frost.engines.common.split_combine_params.key_split_range`; both must cut the same way.
"""
import cutlass
import cutlass.cute as cute


@cute.jit
def key_split_range(n_min, n_max, split, num_splits: cutlass.Constexpr[int]):
    """(lo, hi) of split `split`: ceil((n_max - n_min) / num_splits) tiles each, from n_min up, the last ones
    shorter or empty (lo == hi: the split writes an empty partial, LSE = -inf)."""
    per = (n_max - n_min + (num_splits - 1)) // num_splits
    lo = cutlass.min(n_min + split * per, n_max)
    hi = cutlass.min(lo + per, n_max)
    return lo, hi
