"""Transport through torch.distributed only: the ring's double-buffered neighbour exchange (batched isend /
irecv), the all-gather, reduce-scatter and all-to-all the other schemes use.

On CUDA a ring exchange runs on a side stream: the side stream first waits for the compute stream (the data to
send is ready), the sends and receives are posted there, and the compute stream waits for the side stream only
when it needs the received block. On other devices the same calls run inline. `overlap_for` picks the policy;
its logic is the same either way and tests drive it with recording streams.
"""

from __future__ import annotations

import contextlib

import torch
import torch.distributed as dist


class Inline:
    """No side stream: communication is ordered with compute by program order (CPU, gloo)."""

    def post(self, buffers):
        return contextlib.nullcontext()

    def join(self) -> None:
        pass


class SideStream:
    """Communication on `side`, ordered against `current` (the compute stream) by stream waits.

    post(): side waits for current (what is sent was written there), the buffers are marked as used on side
    (the caching allocator must not reuse them while the transfer runs), and the ops are issued on side.
    join(): current waits for side before the received block is read."""

    def __init__(self, current, side, use_stream, record=torch.Tensor.record_stream):
        self.current, self.side, self.use_stream, self.record = current, side, use_stream, record

    def post(self, buffers):
        self.side.wait_stream(self.current)
        for b in buffers:
            self.record(b, self.side)
        return self.use_stream(self.side)

    def join(self) -> None:
        self.current.wait_stream(self.side)


_SIDE: dict = {}


def overlap_for(device: torch.device):
    """The overlap policy for tensors on `device`: a side stream per CUDA device, inline elsewhere."""
    if device.type != "cuda":
        return Inline()
    side = _SIDE.get(device)
    if side is None:
        side = _SIDE[device] = torch.cuda.Stream(device=device)
    return SideStream(torch.cuda.current_stream(device), side, torch.cuda.stream)


class Ring:
    """Rank r of `group` sends to r + 1 and receives from r - 1, double-buffered: `start(buf)` posts the send
    of `buf` and the receive into the other buffer; `wait()` completes both and returns the received buffer,
    which the next `start` sends while the old one receives. `tag` keeps two rings of one pair apart (gloo
    matches messages by tag)."""

    def __init__(self, group, like: torch.Tensor, tag: int):
        self.group = group
        rank, world = dist.get_rank(group), dist.get_world_size(group)
        self.next = dist.get_global_rank(group, (rank + 1) % world)
        self.prev = dist.get_global_rank(group, (rank - 1) % world)
        self.spare = torch.empty_like(like)
        self.tag = tag
        self.overlap = overlap_for(like.device)
        self.works, self.recv = None, None

    def start(self, send: torch.Tensor) -> None:
        recv = self.spare
        ops = [
            dist.P2POp(dist.isend, send, self.next, self.group, self.tag),
            dist.P2POp(dist.irecv, recv, self.prev, self.group, self.tag),
        ]
        with self.overlap.post((send, recv)):
            self.works = dist.batch_isend_irecv(ops)
        self.recv, self.spare = recv, send

    def wait(self) -> torch.Tensor:
        for w in self.works:
            w.wait()
        self.overlap.join()
        self.works = None
        return self.recv


def all_gather(x: torch.Tensor, group) -> torch.Tensor:
    """Every rank's x stacked along dim 0, rank 0 first (all_gather_into_tensor)."""
    world = dist.get_world_size(group)
    x = x.contiguous()
    out = torch.empty((world * x.shape[0], *x.shape[1:]), dtype=x.dtype, device=x.device)
    (getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor)(out, x, group=group)
    return out


def reduce_scatter(x: torch.Tensor, group) -> torch.Tensor:
    """The sum over ranks of x, rank r keeping its 1/W slice of dim 0 (reduce-scatter)."""
    world = dist.get_world_size(group)
    x = x.contiguous()
    out = torch.empty((x.shape[0] // world, *x.shape[1:]), dtype=x.dtype, device=x.device)
    fn = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor  # the newer name first
    fn(out, x, group=group)
    return out


def all_to_all(x: torch.Tensor, group) -> torch.Tensor:
    """Slice w of dim 0 goes to rank w; slice w of the result came from rank w (all_to_all_single)."""
    x = x.contiguous()
    out = torch.empty_like(x)
    dist.all_to_all_single(out, x, group=group)
    return out
