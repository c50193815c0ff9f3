"""python -m frost.demo: plan and run a small forward and backward on the best engine here.

Prints which engine ran, its plan time and its error against an independent
float64 computation (plain einsum, written here, not frost's reference code).
"""

from __future__ import annotations

import argparse
import math
import time

import torch

import frost


def _oracle(q, k, v, do, scale, causal):
    """float64 attention and its gradients via autograd; inputs (B, H, S, D)."""
    q, k, v = (t.detach().double().requires_grad_(True) for t in (q, k, v))
    g = q.shape[1] // k.shape[1]
    kk, vv = k.repeat_interleave(g, 1), v.repeat_interleave(g, 1)
    s = torch.einsum("bhqd,bhkd->bhqk", q, kk) * scale
    if causal:
        n_q, n_k = s.shape[-2:]
        s = s.masked_fill(torch.ones(n_q, n_k, dtype=torch.bool, device=s.device).triu(1), float("-inf"))
    o = torch.einsum("bhqk,bhkd->bhqd", s.softmax(-1), vv)
    dq, dk, dv = torch.autograd.grad(o, (q, k, v), do.double())
    return o.detach(), dq, dk, dv


def _rel(x, ref):
    return ((x.double() - ref).norm() / ref.norm().clamp_min(1e-30)).item()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m frost.demo", description=__doc__)
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--kv-heads", type=int, default=2)
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--head-dim", type=int, default=64)
    ap.add_argument("--engine", default=None, help="engine name or alias (sm80, sm90, reference)")
    args = ap.parse_args(argv)
    cuda = torch.cuda.is_available()
    dev = "cuda" if cuda else "cpu"
    dt = torch.bfloat16 if cuda else torch.float32
    B, H, Hk, S, D = args.batch, args.heads, args.kv_heads, args.seq, args.head_dim
    scale = 1.0 / math.sqrt(D)
    torch.manual_seed(0)
    # BSHD physical layout, declared as (B, H, S, D) dims with strides
    mk = lambda h: torch.randn(B, S, h, D, device=dev, dtype=dt).permute(0, 2, 1, 3)  # noqa: E731
    q_t, k_t, v_t, do_t = mk(H), mk(Hk), mk(Hk), mk(H)
    o_t = torch.empty_like(q_t)
    lse_t = torch.empty(B, H, S, 1, device=dev, dtype=torch.float32)

    fwd = frost.Graph(io_data_type=dt, intermediate_data_type=torch.float32, compute_data_type=torch.float32)
    q, k, v = (fwd.tensor_like(t, name=n) for t, n in ((q_t, "q"), (k_t, "k"), (v_t, "v")))
    o, stats = fwd.sdpa(q, k, v, attn_scale=scale, generate_stats=True, use_causal_mask=True)
    o.set_output(True)
    stats.set_output(True)
    t0 = time.perf_counter()
    fwd.validate().build_plans(engine=args.engine)
    t_fwd = time.perf_counter() - t0
    ws = torch.empty(fwd.get_workspace_size(), dtype=torch.uint8, device=dev)
    fwd.execute({q: q_t, k: k_t, v: v_t, o: o_t, stats: lse_t}, ws)

    bwd = frost.Graph(io_data_type=dt, intermediate_data_type=torch.float32, compute_data_type=torch.float32)
    names = ("q", "k", "v", "o", "dO", "stats")
    tb = {n: bwd.tensor_like(t, name=n) for n, t in zip(names, (q_t, k_t, v_t, o_t, do_t, lse_t))}
    dq, dk, dv = bwd.sdpa_backward(*(tb[n] for n in names), attn_scale=scale, use_causal_mask=True)
    for t in (dq, dk, dv):
        t.set_output(True)
    t0 = time.perf_counter()
    bwd.validate().build_plans(engine=args.engine)
    t_bwd = time.perf_counter() - t0
    grads = {n: torch.empty_like(t) for n, t in (("dq", q_t), ("dk", k_t), ("dv", v_t))}
    ws_b = torch.empty(bwd.get_workspace_size(), dtype=torch.uint8, device=dev)
    pack = {tb[n]: t for n, t in zip(names, (q_t, k_t, v_t, o_t, do_t, lse_t))}
    pack.update({dq: grads["dq"], dk: grads["dk"], dv: grads["dv"]})
    bwd.execute(pack, ws_b)
    if cuda:
        torch.cuda.synchronize()

    ref_o, ref_dq, ref_dk, ref_dv = _oracle(q_t, k_t, v_t, do_t, scale, causal=True)
    print(
        f"device: {torch.cuda.get_device_name() if cuda else 'cpu'}; problem B={B} H={H}/{Hk} S={S} D={D} "
        f"{str(dt).replace('torch.', '')} causal"
    )
    print(f"forward : engine {fwd.engine_name:<20} plan {t_fwd * 1e3:8.1f} ms  rel err O  {_rel(o_t, ref_o):.2e}")
    print(
        f"backward: engine {bwd.engine_name:<20} plan {t_bwd * 1e3:8.1f} ms  "
        f"rel err dQ {_rel(grads['dq'], ref_dq):.2e}"
        f"  dK {_rel(grads['dk'], ref_dk):.2e}  dV {_rel(grads['dv'], ref_dv):.2e}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
