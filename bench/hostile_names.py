"""Write a job whose detailed window holds many distinct long kernel names: mangled ones that make
a C++ demangler work hard and fail (`--kind hostile`), or plain ones of the same length
(`--kind plain`), for the report's demangling budget (docs/report.md, "Mangled names").

    python bench/hostile_names.py OUT [--kind hostile|plain] [--names 20000] [--bytes 4000]

One rank of 100 ms steps for 2 minutes (bench/synth_job.py's system files and timeline writer), and
a detailed window of 10 steps (steps 100 to 109) with `--names` kernels, each a distinct name of
about `--bytes` bytes, one event each: `_ZN<n>bombs<i>1fI` and `S_` repeated (each `S_` expands
to `bombs<i>`: past symbolic-demangle's 4,096-byte output bound, so it fails after the work), or
`plain_kernel_<i>_xxx…`. Deterministic. Used by BENCHMARKS.md; not a test fixture.
"""

import argparse
import json
import os
import random
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import synth_job  # noqa: E402


def name(kind, i, size):
    if kind == "plain":
        head = "plain_kernel_%05d_" % i
        return head + "x" * max(0, size - len(head))
    ident = "bombs%05d" % i
    head = "_ZN%d%s1fI" % (len(ident), ident)
    return head + "S_" * max(1, (size - len(head) - 4) // 2) + "EEvv"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out")
    ap.add_argument("--kind", choices=["hostile", "plain"], default="hostile")
    ap.add_argument("--names", type=int, default=20000)
    ap.add_argument("--bytes", type=int, default=4000)
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=False)
    sys_args = argparse.Namespace(minutes=2, nodes=1, ranks=1, gpus=1, cores=4, interval=0.5, thermal_node=0)
    synth_job.write_system(args.out, sys_args, random.Random(1))
    start_us = synth_job.START_S * 1_000_000
    tl = synth_job.Timeline(args.out, "0-algo-1", 4000, start_us + 2_000_000)
    t = start_us + 10_000_000
    per_step = args.names // 10
    k = 0
    for step in range(1000):
        dur = 100_000
        if t + dur > start_us + 119_000_000:
            break
        if 100 <= step < 110:
            n = per_step if step < 109 else args.names - k
            for j in range(n):
                k0 = t + 1000 + j * (dur - 2000) // max(n, 1)
                tl.event("gpu_functions-dev:0", name(args.kind, k, args.bytes), k0, 2, step,
                         ', "tid": 7, "device": 0, "start_cpu_thread": 40000, "cpu_thread_start_time": %d' % (k0 - 20))
                k += 1
        tl.event(synth_job.STEP_PHASE, synth_job.STEP_PHASE, t, dur, step)
        t += dur + 200
    tl.seal()
    end = "%.6f\n" % (synth_job.START_S + 120)
    for sub in ("system", "framework"):
        with open(os.path.join(args.out, sub, "training_job_end.ts"), "x") as f:
            f.write(end)
    size = sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(os.path.join(args.out, "framework")) for f in fs)
    print(json.dumps({"kind": args.kind, "names": k, "timeline_bytes": size}))


if __name__ == "__main__":
    main()
