"""Native sampling's cost to the trainer: step time of a CPU-bound trainer side by side in
one run, in three configurations, each round running all three in turn (the same loop
iterations in each, calibrated once here):

  none     no NativeProfilingConfig (the baseline)
  outside  NativeProfilingConfig configured, its window never open during the steps (the
           sampler thread polls; nothing is sampled)
  inside   every measured step inside a 99 Hz window (SamplingHz as configured)

    python bench/native_overhead.py            # BENCH_ROUNDS=5 BENCH_STEPS=60 BENCH_CPU_MS=20
    BENCH_HZ=999 python bench/native_overhead.py

The trainer is tests/hook/scripts/native_trainer.py: each step calls a C hot loop through
ctypes ("c") or runs a pure-Python loop ("python"), about BENCH_CPU_MS of CPU each; a third
trainer ("empty", BENCH_EMPTY_STEPS steps of one loop iteration) shows the per-step cost of
the hook itself (step_begin asks the native window at every step while it is configured). Two
figures per step: the training thread's CPU time (the signal handler runs on the
interrupted thread, so its cost is in there; robust on a loaded machine) and the wall time
(what a trainer sees; noisy when other processes compete for the CPU). Uses the
release library (target/release/libtrainprof_hook.so, or TRAINPROF_HOOK_LIB). The first 3
steps of every run are left out (the window opens at step 1). Prints a report and RESULT
lines for bench/run.py; the goal (docs/formats.md "Native profiling") is ≤ 2 % inside a
99 Hz window and nothing outside.
"""

import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests"))

from trainer_runs import CLEARED_ENV, PACKAGE_DIR  # noqa: E402

ROUNDS = int(os.environ.get("BENCH_ROUNDS", "5"))
STEPS = int(os.environ.get("BENCH_STEPS", "60"))
CPU_MS = float(os.environ.get("BENCH_CPU_MS", "20"))
HZ = int(os.environ.get("BENCH_HZ", "99"))
SKIP = 3
# Steps of the "empty" trainer (one loop iteration per step: the per-step hook cost alone).
EMPTY_STEPS = int(os.environ.get("BENCH_EMPTY_STEPS", "20000"))
LIB = os.environ.get("TRAINPROF_HOOK_LIB") or os.path.join(ROOT, "target", "release", "libtrainprof_hook.so")
SCRIPT = os.path.join(ROOT, "tests", "hook", "scripts", "native_trainer.py")


def config(kind, out):
    params = {"LocalPath": out}
    if kind == "outside":
        params["NativeProfilingConfig"] = json.dumps({"StartStep": 1_000_000, "SamplingHz": HZ})
    elif kind == "inside":
        params["NativeProfilingConfig"] = json.dumps({"StartStep": 1, "NumSteps": 1_000_000, "SamplingHz": HZ})
    return {"ProfilingParameters": params}


def calibrate(work, hot_lib):
    """Iterations of the step's loop that take about CPU_MS of CPU here."""
    import ctypes
    import time

    if work == "c":
        lib = ctypes.CDLL(hot_lib)
        lib.trainprof_hot_c_loop.argtypes = [ctypes.c_ulong]
        fn = lib.trainprof_hot_c_loop
    else:

        def fn(n):
            acc = 1
            for i in range(n):
                acc = (acc * 31 + i) & 0xFFFFFFFF
            return acc

    n = 10_000
    while True:
        t0 = time.process_time()
        fn(n)
        dt = time.process_time() - t0
        if dt > 0.1:
            return max(1, int(n * CPU_MS / 1000.0 / dt))
        n *= 2


def run(work_dir, kind, work, hot_lib, iterations):
    out = os.path.join(work_dir, "out-%s" % kind)
    cfg = os.path.join(work_dir, "cfg-%s.json" % kind)
    with open(cfg, "w") as f:
        json.dump(config(kind, out), f)
    manifest = os.path.join(work_dir, "manifest.json")
    env = {k: v for k, v in os.environ.items() if k not in CLEARED_ENV}
    env.update(
        PYTHONPATH=str(PACKAGE_DIR),
        TRAINPROF_HOOK_LIB=LIB,
        SMPROFILER_CONFIG_PATH=cfg,
        TRAINPROF_RESOURCE_CONFIG=os.path.join(work_dir, "none.json"),
        TRAINPROF_TEST_MANIFEST=manifest,
        TRAINPROF_TEST_PARAMS=json.dumps(
            {
                "hot_lib": hot_lib,
                "steps": (EMPTY_STEPS if work == "empty" else STEPS) + SKIP,
                "iterations": iterations,
                "work": "c" if work == "empty" else work,
                "settle_s": 1.0,
            }
        ),
    )
    proc = subprocess.run([sys.executable, SCRIPT], env=env, capture_output=True, text=True, timeout=600)
    if proc.returncode != 0:
        sys.exit("trainer failed (%s):\n%s" % (kind, proc.stderr))
    with open(manifest) as f:
        m = json.load(f)
    samples = [line.split(": ")[-1].split(" in ")[0] for line in proc.stderr.splitlines() if " samples in " in line]
    shutil.rmtree(out, ignore_errors=True)
    scale = 1e6 if work == "empty" else 1e3
    wall = statistics.median(m["step_s"][SKIP:]) * scale
    cpu = statistics.median(m["step_cpu_s"][SKIP:]) * scale
    return {"cpu": cpu, "wall": wall}, " ".join(samples)


def main():
    if not os.path.isfile(LIB):
        sys.exit("%s is missing: cargo build --release -p trainprof-hook" % LIB)
    work_dir = tempfile.mkdtemp(prefix="native-bench-")
    hot_lib = os.path.join(work_dir, "libhot.so")
    subprocess.run(
        ["cc", "-O1", "-shared", "-fPIC", "-o", hot_lib, os.path.join(ROOT, "tests", "hook", "c", "hot_loop.c")],
        check=True,
    )
    print("library %s; %d rounds × %d steps of %.0f ms CPU; %d Hz" % (LIB, ROUNDS, STEPS, CPU_MS, HZ))
    for work in ("c", "python", "empty"):
        iterations = 1 if work == "empty" else calibrate(work, hot_lib)
        unit = "µs" if work == "empty" else "ms"
        medians = {"none": [], "outside": [], "inside": []}
        for r in range(ROUNDS):
            for kind in medians:
                ms, samples = run(work_dir, kind, work, hot_lib, iterations)
                medians[kind].append(ms)
                print(
                    "  %s round %d %-8s median step: CPU %.3f %s, wall %.3f %s %s"
                    % (work, r, kind, ms["cpu"], unit, ms["wall"], unit, samples)
                )
        for what in ("cpu", "wall"):
            p50 = {k: statistics.median(x[what] for x in v) for k, v in medians.items()}
            base = p50["none"]
            for kind in ("outside", "inside"):
                label = "outside a window (configured)" if kind == "outside" else "inside a %d Hz window" % HZ
                print(
                    "RESULT "
                    + json.dumps(
                        {
                            "metric": "step %s time, %s, %s (p50 of %d rounds)"
                            % (
                                "CPU" if what == "cpu" else "wall",
                                {"c": "C loop", "python": "Python loop", "empty": "empty step"}[work],
                                label,
                                ROUNDS,
                            ),
                            "unit": unit,
                            "trainprof": round(p50[kind], 3),
                            "peer": round(base, 3),
                            "peer_name": "no native config",
                            "better": "lower",
                        }
                    )
                )
                print("  %s %s %s: %+.2f %%" % (work, what, kind, (p50[kind] / base - 1) * 100))
    shutil.rmtree(work_dir, ignore_errors=True)


if __name__ == "__main__":
    main()
