"""Time the backward with K and V head counts apart on each engine that plans it, in one process.

    python3 benchmarks/split_heads_bwd.py --heads 16/16/2,16/2/4,12/4/6 --d 128 --s 4096 --causal 0,1

Each row is one graph through the graph API (bf16, BSHD, 16k tokens: 16384 / S sequences of S): query / K / V head
counts as given, the backward planned on each engine by name (`--engines`: the wgmma and mma.sync backwards by
default); an engine that declines prints its reason. The last column times the same problem with K's heads for V
too on the wgmma backward, so the split heads' cost reads as a ratio. TFLOP/s count the backward as 2.5x the
forward's matmul FLOPs (design.md). Needs a CUDA GPU.
"""

from __future__ import annotations

import argparse
import math
import sys

import torch

import frost
from frost.bench.flops import sdpa_flops, tflops
from quick_problem import timed


def graph(b, s, hq, hk, hv, d, causal, engine):
    """The backward graph over fresh BSHD tensors, planned on `engine`; returns (graph, pack, workspace)."""

    def bshd(h):
        return torch.randn(b, s, h, d, dtype=torch.bfloat16, device="cuda").permute(0, 2, 1, 3)

    t = {"q": bshd(hq), "k": bshd(hk), "v": bshd(hv), "o": bshd(hq), "do": bshd(hq)}
    t["stats"] = torch.randn(b, hq, s, 1, dtype=torch.float32, device="cuda").abs() + 8.0
    g = frost.Graph(io_data_type=torch.bfloat16, intermediate_data_type=torch.float32, compute_data_type=torch.float32)
    ins = {r: g.tensor_like(x, name=r) for r, x in t.items()}
    grads = g.sdpa_backward(
        ins["q"],
        ins["k"],
        ins["v"],
        ins["o"],
        ins["do"],
        ins["stats"],
        attn_scale=1.0 / math.sqrt(d),
        use_causal_mask=causal,
    )
    pack = {ins[r]: x for r, x in t.items()}
    for h, r in zip(grads, ("q", "k", "v")):
        x = torch.empty_like(t[r])
        h.set_output(True).set_dim(tuple(x.shape)).set_stride(tuple(x.stride()))
        pack[h] = x
    g.validate()
    g.build_plans(engine=engine)
    ws = torch.empty(g.get_workspace_size(), dtype=torch.uint8, device="cuda")
    return g, pack, ws


def time_graph(*args) -> float:
    g, pack, ws = graph(*args)
    ctx = frost.ExecutionContext()
    return timed(lambda: g.execute(pack, ws, ctx))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--heads", default="16/16/2,16/2/4,12/4/6", help="query/K/V head counts, comma separated")
    ap.add_argument("--d", type=int, default=128)
    ap.add_argument("--s", default="4096")
    ap.add_argument("--causal", default="0,1")
    ap.add_argument("--engines", default="SdpaBwdDslSm90,SdpaBwdDslSm80")
    a = ap.parse_args(argv)
    if not torch.cuda.is_available():
        sys.exit("needs a CUDA GPU")
    engines = a.engines.split(",")
    print(f"# {torch.cuda.get_device_name(0)}, torch {torch.__version__}, frost {frost.__version__}")
    print("| heads q/k/v | d | s | causal | " + " | ".join(engines) + " | wgmma, V with K's heads |")
    print("|---" * (5 + len(engines)) + "|")
    for heads in a.heads.split(","):
        hq, hk, hv = (int(x) for x in heads.split("/"))
        for s in (int(x) for x in a.s.split(",")):
            b = max(1, 16384 // s)
            for causal in (bool(int(x)) for x in a.causal.split(",")):
                flops = sdpa_flops(heads=hq, d_qk=a.d, d_v=a.d, causal=causal, direction="bwd", batch=b, seqlen_q=s)
                cells = []
                for engine in engines + ["SdpaBwdDslSm90"]:
                    kv = (hk, hk) if len(cells) == len(engines) else (hk, hv)
                    try:
                        ms = time_graph(b, s, hq, *kv, a.d, causal, engine)
                        cells.append(f"{ms:.3f} ms {tflops(flops, ms):.0f} TF")
                    except frost.NotSupportedError as e:
                        cells.append(f"declines: {str(e).splitlines()[0][:60]}")
                print(f"| {heads} | {a.d} | {s} | {int(causal)} | " + " | ".join(cells) + " |", flush=True)


if __name__ == "__main__":
    main()
