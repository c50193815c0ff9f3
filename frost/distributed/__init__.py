"""Context parallelism on torch.distributed: one sequence split over the ranks of a process group, frost
computing every block through its torch face (`docs/context_parallel.md`).

    from frost.distributed import context_parallel_attention, shard_sequence
    q_local = shard_sequence(q, rank=rank, world=world)          # head-tail: balanced under a causal mask
    out_local = context_parallel_attention(q_local, k_local, v_local, causal=True, scheme="ring")

`import frost` does not load it.
"""

from frost.distributed.api import context_parallel_attention
from frost.distributed.shard import local_cu_seqlens, shard_positions, shard_sequence, unshard_sequence

__all__ = ["context_parallel_attention", "shard_sequence", "unshard_sequence", "local_cu_seqlens", "shard_positions"]
