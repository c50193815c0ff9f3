"""The walks of split dQ copies (`dq_splits`): which key tiles each of a head's split CTAs takes, in which order.

Plain integer arithmetic (no cutlass import): the kernel calls it on Int32s, the CPU tests on ints.
"""

from __future__ import annotations


def split_tile(it, split, splits: int):
    """The key tile of step `it` of split CTA `split` (`dq_splits`): rounds of `splits` tiles, walked forward
    and backward in turn, so the CTAs' causal work evens out. Plain arithmetic: kernels call it on Int32s."""
    return it * splits + split + (it % 2) * (splits - 1 - 2 * split)


def split_tile_count(num_n, split, splits: int):
    """How many of `num_n` key tiles `split_tile` gives split CTA `split`: the whole rounds, plus one when its
    place in the last, partial round lies inside it."""
    rounds = num_n // splits
    rest = num_n - rounds * splits
    place = split + (rounds % 2) * (splits - 1 - 2 * split)
    return rounds + (rest - place + splits - 1) // splits  # + 1 exactly when place < rest
