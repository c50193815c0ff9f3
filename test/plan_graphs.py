"""The graphs the plan-time tests build: a packed causal forward and a dense causal backward.

test_plan_io also runs this source in fresh interpreters (GRAPHS), so it imports only torch and frost.
"""

import torch

import frost
from frost.target import fake_target  # noqa: F401  (the fresh-interpreter scripts use it)


def fwd_thd(target, d=128, total=4096, batch=3):
    g = frost.Graph(io_data_type=torch.bfloat16, target=target)
    q = g.tensor(name="q", dim=(total, 8, d), stride=(8 * d, d, 1))
    k = g.tensor(name="k", dim=(total, 2, d), stride=(2 * d, d, 1))
    v = g.tensor(name="v", dim=(total, 2, d), stride=(2 * d, d, 1))
    cq = g.tensor(name="cu_seq_len_q", dim=(batch + 1,), stride=(1,), data_type=torch.int32)
    ck = g.tensor(name="cu_seq_len_kv", dim=(batch + 1,), stride=(1,), data_type=torch.int32)
    o, st = g.sdpa(
        q,
        k,
        v,
        attn_scale=0.088,
        generate_stats=True,
        use_causal_mask=True,
        cu_seq_len_q=cq,
        cu_seq_len_kv=ck,
        max_seq_len_q=2048,
        max_seq_len_kv=2048,
    )
    o.set_output(True)
    st.set_output(True)
    return g


def bwd_dense(target, b=2, h=4, s=256, d=128):
    g = frost.Graph(
        io_data_type=torch.bfloat16,
        intermediate_data_type=torch.float32,
        compute_data_type=torch.float32,
        target=target,
    )
    bshd = (s * h * d, d, h * d, 1)
    q, k, v, o, do = (g.tensor(name=n, dim=(b, h, s, d), stride=bshd) for n in ("q", "k", "v", "o", "dO"))
    st = g.tensor(name="stats", dim=(b, h, s, 1), stride=(h * s, s, 1, 1), data_type=torch.float32)
    for t in g.sdpa_backward(q, k, v, o, do, st, attn_scale=0.088, use_causal_mask=True):
        t.set_output(True)
    return g


BUILD = {"fwd": fwd_thd, "bwd": bwd_dense}
