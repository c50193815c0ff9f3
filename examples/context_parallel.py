"""Train the small byte-level GPT of `train_gpt.py` with context parallelism: every sequence split over N
processes (head-tail), attention through `frost.distributed.context_parallel_attention`.

    torchrun --nproc-per-node 2 examples/context_parallel.py --device cpu --steps 100     # gloo, reference engine
    torchrun --nproc-per-node 8 examples/context_parallel.py --scheme ring                # NCCL, one GPU a rank
    python examples/context_parallel.py --device cpu --steps 100                          # one process, no CP

Every rank draws the same batches (same seed) and keeps its share of each sequence's tokens and positions;
the loss is the mean over every rank's tokens, and the parameters' gradients are summed over the ranks (as
data parallelism would), so N processes train the same model as one. Without torchrun the script runs the
single-process baseline (`frost.torch_face.attention`). Rank 0 prints the losses and writes a JSON summary.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
from train_gpt import GPT, batches, lr_at, stdlib_bytes  # noqa: E402


class CpGPT(GPT):
    """The GPT with explicit token positions (a rank's share of the sequence is not 0..T-1)."""

    def forward(self, idx, targets, positions):
        x = self.tok(idx) + self.pos(positions)
        for block in self.blocks:
            x = block(x)
        logits = self.head(self.norm(x))
        return F.cross_entropy(logits.float().view(-1, 256), targets.reshape(-1))


def attention_fn(group, scheme: str):
    """causal attention on this rank's (B, T_local, H, D) q, k, v, or a single process's whole sequence."""
    if group is None:
        from frost.torch_face import attention

        return lambda q, k, v: attention(q, k, v, causal=True, layout="bshd")
    from frost.distributed import context_parallel_attention

    def cp(q, k, v):
        out = context_parallel_attention(
            q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), group=group, scheme=scheme, causal=True
        )
        return out.transpose(1, 2)

    return cp


def parse(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--scheme", choices=("ring", "all_gather", "ulysses"), default="ring")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--width", type=int, default=64)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--context", type=int, default=64, help="tokens per sequence (a multiple of 2 x ranks)")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--data-mb", type=float, default=1.0)
    ap.add_argument("--log-every", type=int, default=10)
    ap.add_argument("--out", default=None, help="write the summary JSON here (rank 0)")
    return ap.parse_args(argv)


def main(argv=None) -> dict:
    args = parse(argv)
    launched = "RANK" in os.environ and "WORLD_SIZE" in os.environ
    cuda = args.device.startswith("cuda")
    group, rank, world = None, 0, 1
    if launched:
        backend = "nccl" if cuda else "gloo"
        dist.init_process_group(backend, timeout=datetime.timedelta(seconds=300))
        group, rank, world = dist.group.WORLD, dist.get_rank(), dist.get_world_size()
    device = torch.device(f"cuda:{int(os.environ.get('LOCAL_RANK', 0))}" if cuda else "cpu")
    if cuda:
        torch.cuda.set_device(device)
    torch.manual_seed(args.seed)
    data = torch.frombuffer(bytearray(stdlib_bytes(args.data_mb)), dtype=torch.uint8)
    model = CpGPT(args.layers, args.width, args.heads, args.context, attention_fn(group, args.scheme)).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.95), weight_decay=0.1)
    amp = torch.autocast("cuda", dtype=torch.bfloat16) if cuda else torch.autocast("cpu", enabled=False)
    it = batches(data, args.batch, args.context, torch.Generator().manual_seed(args.seed))
    positions = torch.arange(args.context)
    if launched:
        from frost.distributed import shard_positions, shard_sequence

        positions = shard_positions(args.context, rank=rank, world=world)
    positions = positions.to(device)
    losses = []
    for step in range(args.steps):
        x, y = next(it)
        if launched:  # this rank's share of every sequence, head-tail
            x, y = (shard_sequence(t, rank=rank, world=world, dim=1) for t in (x, y))
        x, y = x.to(device), y.to(device)
        for g in opt.param_groups:
            g["lr"] = lr_at(step, args.steps, args.lr, warmup=max(args.steps // 20, 1))
        with amp:
            loss = model(x, y, positions)
        loss.backward()
        loss = loss.detach()
        if launched:  # mean over every rank's tokens (equal shares), gradients of that mean
            dist.all_reduce(loss)
            loss /= world
            for p in model.parameters():
                dist.all_reduce(p.grad)
                p.grad /= world
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(loss.item())
        if rank == 0 and (step + 1) % args.log_every == 0:
            print(f"step {step + 1:4d}  loss {losses[-1]:.4f}")
    summary = {"world": world, "scheme": args.scheme if launched else None, "losses": losses, "args": vars(args)}
    if rank == 0 and args.out:
        Path(args.out).write_text(json.dumps(summary))
    if launched:
        dist.destroy_process_group()
    return summary


if __name__ == "__main__":
    main()
