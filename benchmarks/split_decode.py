"""Split-KV against no split: decode rows on frost's DSL forwards, the plan's own split count against
`num_splits=1`, timed interleaved in one process (several rounds, the order rotated each round).

Each row is a decode (GQA 32:8, d=128, bf16, one query token a sequence unless --sq) over a dense or paged
(64-row blocks) cache; it prints each variant's median and min-max per call in microseconds, the K/V bytes read per
second, and the split plan's speed ratio to the unsplit one with its range from the extremes: a win or a loss only
when the two time ranges do not overlap, else a tie (docs/gpu_verification.md); where the plan does not split, the
row says "same plan" and its ratio measures the noise between two plans of one kernel. The split choice
(frost/adapters/split_kv.py) was made without GPU timings: this is what checks it.

    python benchmarks/split_decode.py                         # both forwards (the wgmma one on SM90 only)
    python benchmarks/split_decode.py --engines sm80 --rows 1x32768,4x8192
    python benchmarks/split_decode.py --device cpu --rows 1x256   # a host dry run on the reference engine
"""

from __future__ import annotations

import argparse
import statistics
import sys

import torch

import frost
from frost.bench.timing import TimingOptions, time_calls

HQ, HKV, D = 32, 8, 128
ENGINES = {"sm80": "SdpaFwdDslSm80", "sm90": "SdpaFwdDslSm90"}


def decode_graph(batch, sq, skv, paged, engine, knobs, device):
    """(graph, variant pack, workspace, K/V bytes a call reads) of one decode; engine None: the reference."""
    gen = torch.Generator().manual_seed(batch + skv)
    x = {"q": torch.randn(batch, HQ, sq, D, generator=gen).bfloat16()}
    kw = dict(use_padding_mask=True, use_causal_mask_bottom_right=True)
    if paged:
        per_seq = -(-skv // paged)
        x["k"], x["v"] = (torch.randn(batch * per_seq, HKV, paged, D, generator=gen).bfloat16() for _ in "kv")
        x["kt"] = torch.randperm(batch * per_seq, generator=gen).to(torch.int32).reshape(batch, 1, per_seq, 1)
        x["vt"] = x["kt"].clone()
    else:
        x["k"], x["v"] = (torch.randn(batch, HKV, skv, D, generator=gen).bfloat16() for _ in "kv")
    x["lq"] = torch.full((batch, 1, 1, 1), sq, dtype=torch.int32)
    x["lk"] = torch.full((batch, 1, 1, 1), skv, dtype=torch.int32)
    g = frost.pygraph(io_data_type=frost.data_type.BFLOAT16, compute_data_type=frost.data_type.FLOAT)
    dt = {torch.bfloat16: frost.data_type.BFLOAT16, torch.int32: frost.data_type.INT32}
    t = {n: g.tensor(name=n, dim=v.shape, stride=v.stride(), data_type=dt[v.dtype]) for n, v in x.items()}
    if paged:
        kw.update(paged_attention_k_table=t["kt"], paged_attention_v_table=t["vt"])
        kw["paged_attention_max_seq_len_kv"] = skv
    o, _ = g.sdpa(q=t["q"], k=t["k"], v=t["v"], attn_scale=D**-0.5, seq_len_q=t["lq"], seq_len_kv=t["lk"], **kw)
    x["o"] = torch.empty(batch, HQ, sq, D, dtype=torch.bfloat16)
    o.set_output(True).set_dim(x["o"].shape).set_stride(x["o"].stride())
    t["o"] = o
    g.validate()
    g.build_plans(engine=engine or "reference", knobs=knobs)
    if engine is not None:
        assert g.engine_name == ENGINES[engine], g.engine_name
    pack = {t[n]: v.to(device) for n, v in x.items()}
    ws = torch.empty(g.get_workspace_size(), dtype=torch.uint8, device=device)
    return g, pack, ws, 2 * batch * HKV * skv * D * 2


def splits_of(g) -> int:
    params = getattr(g.plan.adapter, "params", None)
    return getattr(params, "num_splits", 1)


def row(batch, sq, skv, paged, engine, rounds, device):
    """Both variants of one row, timed in `rounds` rotated rounds; returns the printed line."""
    opts = TimingOptions(warmup=3, reps=5, min_sample_ms=1.0, max_inner=200)
    variants = {}
    for name, knobs in (("planned", None), ("unsplit", frost.Knobs(num_splits=1) if engine else None)):
        g, pack, ws, kv_bytes = decode_graph(batch, sq, skv, paged, engine, knobs, device)
        variants[name] = (g, pack, ws)
    samples = {name: [] for name in variants}
    names = list(variants)
    for r in range(rounds):
        for name in names[r % 2 :] + names[: r % 2]:
            g, pack, ws = variants[name]
            samples[name].append(time_calls([lambda g=g, p=pack, w=ws: g.execute(p, w)], opts, device=device).median_ms)
    med = {n: statistics.median(s) for n, s in samples.items()}
    lo = {n: min(s) for n, s in samples.items()}
    hi = {n: max(s) for n, s in samples.items()}
    ratio = med["unsplit"] / med["planned"]
    spread = (lo["unsplit"] / hi["planned"], hi["unsplit"] / lo["planned"])
    verdict = "win" if lo["unsplit"] > hi["planned"] else "loss" if hi["unsplit"] < lo["planned"] else "tie"
    if engine and splits_of(variants["planned"][0]) == 1:
        verdict = "same plan"  # two plans of one kernel on their own buffers: the ratio is the noise floor
    cells = [
        f"{n} {med[n] * 1e3:8.1f}us [{lo[n] * 1e3:.1f}-{hi[n] * 1e3:.1f}] {kv_bytes / med[n] / 1e9:5.2f}TB/s"
        for n in names
    ]
    form = f"paged{paged}" if paged else "dense"
    head = f"{engine or 'reference'} {batch}x{skv} sq={sq} {form} splits={splits_of(variants['planned'][0])}"
    return " | ".join([head, *cells, f"split/unsplit x{ratio:.2f} [{spread[0]:.2f}-{spread[1]:.2f}] {verdict}"])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", default="1x32768,2x131072,4x8192,8x32768,64x8192", help="BxSkv,...")
    ap.add_argument("--sq", type=int, default=1, help="query tokens a sequence (at most 16 split)")
    ap.add_argument("--engines", default="sm80,sm90")
    ap.add_argument("--paged", default="0,64", help="block sizes, 0 for a dense cache")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--device", default="cuda")
    a = ap.parse_args(argv)
    cpu = a.device == "cpu"
    engines = [None] if cpu else a.engines.split(",")
    if not cpu and torch.cuda.get_device_capability() != (9, 0):
        engines = [e for e in engines if e != "sm90"]
    name = "cpu (reference engine)" if cpu else torch.cuda.get_device_name(0)
    print(f"# {name}, frost {frost.__version__}, GQA {HQ}:{HKV}, d={D}, bf16", flush=True)
    for spec in a.rows.split(","):
        batch, skv = (int(v) for v in spec.split("x"))
        for paged in (int(p) for p in a.paged.split(",")):
            for engine in engines:
                print(row(batch, a.sq, skv, paged, engine, a.rounds, a.device), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
