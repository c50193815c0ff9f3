"""Train a small byte-level GPT on the Python standard library's own source, with frost's attention.

    python examples/train_gpt.py --attention frost          # H200: 300 steps in a few minutes
    python examples/train_gpt.py --attention sdpa           # the same run on torch's SDPA (same seed, same data)
    python examples/train_gpt.py --device cpu --layers 1 --width 64 --heads 2 --context 64 --steps 2   # smoke

The text is every .py file under `sysconfig.get_paths()["stdlib"]` (site-packages excluded), so every
Python ships it. The model is a pre-norm decoder (learned positions, GELU MLP); attention is causal and
one call: `frost.torch_face.attention`, `F.scaled_dot_product_attention` or FlashAttention-4's
`flash_attn.cute.flash_attn_func`. CUDA runs in bf16 autocast with torch.compile; the CPU runs fp32
eager (frost's reference engine). It logs loss and tokens/s and writes `<attention>_loss.png` and
`<attention>_summary.json` to --out-dir (--compare-with overlays other runs' summaries on the plot).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sysconfig
import time
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F


def stdlib_bytes(max_mb: float) -> bytes:
    """The stdlib's .py sources in sorted path order, up to `max_mb` megabytes."""
    root = Path(sysconfig.get_paths()["stdlib"])
    cap = int(max_mb * 2**20)
    chunks, size = [], 0
    for path in sorted(root.rglob("*.py")):
        if "site-packages" in path.parts or "dist-packages" in path.parts:
            continue
        try:
            data = path.read_bytes()
        except OSError:
            continue
        chunks.append(data)
        size += len(data)
        if size >= cap:
            break
    if not chunks:
        raise SystemExit(f"no .py files under {root}")
    return b"\n".join(chunks)[:cap]


def attention_fn(kind: str):
    """causal attention on (B, T, H, D) q, k, v -> (B, T, H, D)."""
    if kind == "frost":
        from frost.torch_face import attention

        return lambda q, k, v: attention(q, k, v, causal=True, layout="bshd")
    if kind == "sdpa":

        def sdpa(q, k, v):
            out = F.scaled_dot_product_attention(
                q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True
            )
            return out.transpose(1, 2)

        return sdpa
    if kind == "fa4":
        try:
            from flash_attn.cute import flash_attn_func
        except ImportError as e:
            raise SystemExit(f"--attention fa4 needs FlashAttention-4 (package flash-attn-4): {e}")

        def fa4(q, k, v):
            out = flash_attn_func(q, k, v, causal=True)
            return out[0] if isinstance(out, tuple) else out

        return fa4
    raise SystemExit(f"unknown --attention {kind!r}")


class Block(nn.Module):
    def __init__(self, width: int, heads: int, attend):
        super().__init__()
        self.heads, self.attend = heads, attend
        self.norm1, self.norm2 = nn.LayerNorm(width), nn.LayerNorm(width)
        self.qkv = nn.Linear(width, 3 * width, bias=False)
        self.proj = nn.Linear(width, width, bias=False)
        self.mlp = nn.Sequential(
            nn.Linear(width, 4 * width, bias=False), nn.GELU(), nn.Linear(4 * width, width, bias=False)
        )

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = self.qkv(self.norm1(x)).view(b, t, 3, self.heads, c // self.heads).unbind(2)
        x = x + self.proj(self.attend(q, k, v).reshape(b, t, c))
        return x + self.mlp(self.norm2(x))


class GPT(nn.Module):
    def __init__(self, layers: int, width: int, heads: int, context: int, attend):
        super().__init__()
        self.tok = nn.Embedding(256, width)
        self.pos = nn.Embedding(context, width)
        self.blocks = nn.ModuleList(Block(width, heads, attend) for _ in range(layers))
        self.norm = nn.LayerNorm(width)
        self.head = nn.Linear(width, 256, bias=False)
        self.apply(self._init)

    @staticmethod
    def _init(m):
        if isinstance(m, (nn.Linear, nn.Embedding)):
            nn.init.normal_(m.weight, std=0.02)

    def forward(self, idx, targets):
        x = self.tok(idx) + self.pos(torch.arange(idx.shape[1], device=idx.device))
        for block in self.blocks:
            x = block(x)
        logits = self.head(self.norm(x))
        return F.cross_entropy(logits.float().view(-1, 256), targets.reshape(-1))


def batches(data: torch.Tensor, batch: int, context: int, gen: torch.Generator):
    while True:
        starts = torch.randint(0, data.numel() - context - 1, (batch,), generator=gen)
        rows = torch.stack([data[s : s + context + 1] for s in starts.tolist()]).long()
        yield rows[:, :-1], rows[:, 1:]


def lr_at(step: int, steps: int, peak: float, warmup: int) -> float:
    if step < warmup:
        return peak * (step + 1) / warmup
    return peak * 0.5 * (1 + math.cos(math.pi * min((step - warmup) / max(steps - warmup, 1), 1.0)))


def parse(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--attention", choices=("frost", "sdpa", "fa4"), default="frost")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--layers", type=int, default=6)
    ap.add_argument("--width", type=int, default=768)
    ap.add_argument("--heads", type=int, default=12)
    ap.add_argument("--context", type=int, default=2048)
    ap.add_argument("--batch", type=int, default=16, help="sequences per step")
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument(
        "--compile",
        choices=("auto", "on", "off"),
        default="auto",
        help="torch.compile the model (auto: on for CUDA, off on the CPU)",
    )
    ap.add_argument("--data-mb", type=float, default=32.0, help="megabytes of stdlib source to read")
    ap.add_argument("--log-every", type=int, default=10)
    ap.add_argument("--eval-batches", type=int, default=8)
    ap.add_argument("--out-dir", default="train_gpt_out")
    ap.add_argument("--compare-with", nargs="*", default=(), help="summary JSONs of other runs to overlay")
    return ap.parse_args(argv)


def main(argv=None) -> dict:
    args = parse(argv)
    device = torch.device(args.device)
    cuda = device.type == "cuda"
    torch.manual_seed(args.seed)
    text = stdlib_bytes(args.data_mb)
    data = torch.frombuffer(bytearray(text), dtype=torch.uint8)
    split = int(data.numel() * 0.95)
    train, val = data[:split], data[split:]
    if val.numel() <= args.context + 1:
        val = train
    model = GPT(args.layers, args.width, args.heads, args.context, attention_fn(args.attention)).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.95), weight_decay=0.1, fused=cuda or None)
    step_fn = model
    if args.compile == "on" or (args.compile == "auto" and cuda):
        step_fn = torch.compile(model)
    amp = torch.autocast("cuda", dtype=torch.bfloat16) if cuda else torch.autocast("cpu", enabled=False)
    gen = torch.Generator().manual_seed(args.seed)
    it = batches(train, args.batch, args.context, gen)
    tokens_per_step = args.batch * args.context
    print(
        f"{args.attention}: {sum(p.numel() for p in model.parameters()) / 1e6:.1f}M parameters, "
        f"{len(text) / 2**20:.1f} MB of stdlib text, {tokens_per_step} tokens/step on {device}"
    )

    losses, rates, first_step_s = [], [], None
    t_run = t_mark = time.perf_counter()
    mark_step = 0
    for step in range(args.steps):
        x, y = (t.to(device, non_blocking=True) for t in next(it))
        for group in opt.param_groups:
            group["lr"] = lr_at(step, args.steps, args.lr, warmup=max(args.steps // 20, 1))
        with amp:
            loss = step_fn(x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        if step == 0 or (step + 1) % args.log_every == 0 or step + 1 == args.steps:
            value = loss.item()  # synchronizes: the interval's time is the GPU's
            now = time.perf_counter()
            if step == 0:
                first_step_s = now - t_mark
            else:
                rate = (step - mark_step) * tokens_per_step / (now - t_mark)
                rates.append(rate)
                print(f"step {step + 1:5d}  loss {value:.4f}  {rate / 1e3:9.1f}k tokens/s")
            losses.append((step + 1, value))
            t_mark, mark_step = now, step
    total_s = time.perf_counter() - t_run

    model.eval()
    egen = torch.Generator().manual_seed(args.seed + 1)
    eit = batches(val, args.batch, args.context, egen)
    with torch.no_grad(), amp:
        val_loss = sum(step_fn(*(t.to(device) for t in next(eit))).item() for _ in range(args.eval_batches))
    val_loss /= max(args.eval_batches, 1)
    steady = rates[len(rates) // 4 :] or rates
    summary = {
        "attention": args.attention,
        "device": torch.cuda.get_device_name(device) if cuda else "cpu",
        "args": vars(args),
        "torch": torch.__version__,
        "parameters": sum(p.numel() for p in model.parameters()),
        "final_loss": losses[-1][1],
        "val_loss": val_loss,
        "losses": losses,
        "tokens_per_s": sum(steady) / len(steady) if steady else None,
        "first_step_s": first_step_s,
        "total_s": total_s,
        "max_memory_gb": torch.cuda.max_memory_allocated(device) / 2**30 if cuda else None,
    }
    if args.attention == "frost":
        from frost.torch_face import plan_cache_info

        info = plan_cache_info()
        summary["frost_plans"] = {
            "plans": info["misses"],
            "specializations": len(info["specializations"]),
            "plan_seconds": info["plan_seconds"],
        }
    out = Path(args.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{args.attention}_summary.json").write_text(json.dumps(summary, indent=1))
    _plot(out / f"{args.attention}_loss.png", summary, args.compare_with)
    print(
        f"done: loss {summary['final_loss']:.4f} (val {val_loss:.4f}), "
        f"{(summary['tokens_per_s'] or 0) / 1e3:.1f}k tokens/s, first step {first_step_s:.1f} s, "
        f"total {total_s:.1f} s -> {out}"
    )
    return summary


def _plot(path: Path, summary: dict, others) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = [summary] + [json.loads(Path(p).read_text()) for p in others if os.path.exists(p)]
    runs = [r for i, r in enumerate(runs) if i == 0 or r["attention"] != summary["attention"]]
    fig, ax = plt.subplots(figsize=(7, 4))
    for run in runs:
        steps, values = zip(*run["losses"])
        rate = run.get("tokens_per_s")
        label = run["attention"] + (f" ({rate / 1e3:.0f}k tok/s)" if rate else "")
        ax.plot(steps, values, label=label)
    ax.set_xlabel("step")
    ax.set_ylabel("training loss (nats/byte)")
    ax.set_title(f"byte-level GPT on the stdlib, {summary['args']['layers']} layers x {summary['args']['width']}")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


if __name__ == "__main__":
    main()
