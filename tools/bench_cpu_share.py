"""Do this machine's cores slow each other down? (prints numbers; not a test; run it on a quiet box)

    python tools/bench_cpu_share.py [--sizes 128,256,1024] [--rounds 5] [--seconds 1.2]

A one-thread torch loop (C = A @ B; A = C * 1e-3 + A, square matrices of each size) pinned to
CPU 0 is timed alone, then beside the same loop pinned to CPU 1, in alternating rounds. The
median ratio (beside / alone) is what a one-thread trainer loses while a one-thread owner works
on the other core. On a machine whose two vCPUs are SMT siblings of one physical core (a
guest cannot see this: lscpu reports 1 thread per core either way), it is well above 1.

Why it is here: issue 14's goal 1 compares L2RR's loop with its no-feedback ablation in
`simulate`, where the owner's evaluations run on the same machine as the trainer. 128 is about
the tiny policy's width (overhead-bound, small kernels); 256 and 1024 are compute-bound.
Linux only (os.sched_setaffinity); needs at least 2 CPUs.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time


def loop(size: int, iterations: int) -> float:
    """Seconds for `iterations` rounds of the loop, one torch thread."""
    import torch

    torch.set_num_threads(1)
    a, b = torch.randn(size, size), torch.randn(size, size)
    started = time.perf_counter()
    for _ in range(iterations):
        a = (a @ b) * 1e-3 + a
    return time.perf_counter() - started


def load_forever(size: int) -> None:
    os.sched_setaffinity(0, {1})
    while True:
        loop(size, 1000)


def measure(size: int, rounds: int, seconds: float) -> dict:
    os.sched_setaffinity(0, {0})
    loop(size, 20)  # warm-up: allocator, kernels
    per_second = 20 / max(loop(size, 20), 1e-9)
    iterations = max(int(per_second * seconds), 1)
    alone, beside = [], []
    for _ in range(rounds):
        alone.append(loop(size, iterations))
        load = subprocess.Popen([sys.executable, __file__, "--load", str(size)])
        try:
            time.sleep(1.0)  # the load process imports torch and starts spinning
            beside.append(loop(size, iterations))
        finally:
            load.kill()
            load.wait()
        time.sleep(0.3)
    ratio = statistics.median(beside) / statistics.median(alone)
    return {"size": size, "iterations": iterations, "alone_s": [round(x, 3) for x in alone],
            "beside_s": [round(x, 3) for x in beside], "ratio": round(ratio, 3)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="128,256,1024", help="matrix sizes, comma-separated")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--seconds", type=float, default=1.2, help="length of one timed loop, alone")
    parser.add_argument("--load", type=int, help=argparse.SUPPRESS)  # the child: spin on CPU 1
    parser.add_argument("--json", action="store_true", help="one JSON object per size")
    args = parser.parse_args()
    if args.load is not None:
        load_forever(args.load)
        return
    if len(os.sched_getaffinity(0)) < 2:
        raise SystemExit("needs at least 2 CPUs (this process may use fewer)")
    for size in (int(s) for s in args.sizes.split(",")):
        row = measure(size, args.rounds, args.seconds)
        if args.json:
            print(json.dumps(row))
        else:
            print(f"size {size:5d}: alone {statistics.median(row['alone_s']):.3f} s, beside a load on CPU 1 "
                  f"{statistics.median(row['beside_s']):.3f} s, ratio {row['ratio']:.2f}x (median of {args.rounds})")


if __name__ == "__main__":
    main()
