"""One frost backward and one peer backward (FlashAttention-2 through torch's flash backend, or FA4 with
--peer fa4) between cudaProfilerStart/Stop, for ncu.

    ncu --profile-from-start off --kernel-name regex:"frost_sdpa_bwd_main|flash_bwd_dq_dk_dv" \
        --section SpeedOfLight ... python3 benchmarks/profile_bwd.py --d 128 --s 16384

bf16, B = 16384 / S, H = 2048 / D, BSHD storage. Both sides are the benchmark harness's own
(`frost.bench`: frost's best engine for the workload and the FA2 peer), prepared and run once untimed
first (compile, module load, forward state), then once inside the profiled range.
"""

from __future__ import annotations

import argparse
import dataclasses


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--d", type=int, default=128)
    ap.add_argument("--s", type=int, default=16384)
    ap.add_argument("--causal", type=int, default=0)
    ap.add_argument(
        "--det", type=int, default=0, help="frost's deterministic backward (the peer then runs its usual one)"
    )
    ap.add_argument("--peer", default="fa2", help="the peer profiled beside frost: fa2 (torch's flash backend) or fa4")
    a = ap.parse_args(argv)
    import torch

    from frost.bench.frost_runner import FrostEngine, list_engines
    from frost.bench.inputs import make_inputs
    from frost.bench.peers import all_peers
    from frost.bench.workloads import Workload

    h = 2048 // a.d
    w = Workload(
        direction="bwd",
        dtype="bf16",
        d_qk=a.d,
        d_v=a.d,
        heads_q=h,
        heads_kv=h,
        causal=bool(a.causal),
        batch=max(16384 // a.s, 1),
        seqlen_q=a.s,
        seqlen_kv=a.s,
        deterministic=bool(a.det),
    )
    inputs = make_inputs(w, 1, torch.device("cuda"))
    engine = list_engines(w)[0]
    peer = next(p for p in all_peers() if p.key == a.peer)
    sides = [
        FrostEngine(engine).prepare(inputs),
        peer.prepare(make_inputs(dataclasses.replace(w, deterministic=False), 1, torch.device("cuda"))),
    ]
    print(f"# frost engine {engine}")

    def run_both():
        for prepared in sides:
            with prepared.context():
                prepared.calls[0]()

    run_both()
    torch.cuda.synchronize()
    torch.cuda.profiler.start()
    run_both()
    torch.cuda.synchronize()
    torch.cuda.profiler.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
