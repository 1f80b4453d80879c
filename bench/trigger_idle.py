"""What `trainprof trigger`'s way in costs a job that never uses it (docs/trigger.md, "Cost
while idle"): step time of the same trainer side by side in one run, each round running
both in turn, with the same loop iterations (calibrated once here):

  off   on-demand windows off in the process: a regular file planted where the hook's
        `trigger/` folder would be (the hook refuses it with one line and polls nothing),
        the baseline
  on    the default: the `trigger/` folder made, the writer thread looking at it once a
        second, the training thread loading one flag per step

    python bench/trigger_idle.py            # BENCH_ROUNDS=5 BENCH_STEPS=60 BENCH_CPU_MS=20

The trainer is tests/hook/scripts/native_trainer.py (no native config): "c" steps of about
BENCH_CPU_MS of CPU in a C loop, and "empty" steps (BENCH_EMPTY_STEPS of one loop iteration:
the hook's own per-step cost). Two figures per step: the training thread's CPU time and the
wall time. Uses the release library (target/release/libtrainprof_hook.so, or
TRAINPROF_HOOK_LIB). Prints RESULT lines for bench/run.py; the goal is no difference beyond
the runs' spread.
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
sys.path.insert(0, os.path.join(ROOT, "bench"))

from native_overhead import calibrate  # noqa: E402
from trainer_runs import CLEARED_ENV, PACKAGE_DIR  # noqa: E402

ROUNDS = int(os.environ.get("BENCH_ROUNDS", "5"))
STEPS = int(os.environ.get("BENCH_STEPS", "60"))
EMPTY_STEPS = int(os.environ.get("BENCH_EMPTY_STEPS", "20000"))
SKIP = 3
LIB = os.environ.get("TRAINPROF_HOOK_LIB") or os.path.join(ROOT, "target", "release", "libtrainprof_hook.so")
SCRIPT = os.path.join(ROOT, "tests", "hook", "scripts", "native_trainer.py")


def run(work_dir, kind, work, hot_lib, iterations):
    out = os.path.join(work_dir, "out-%s" % kind)
    shutil.rmtree(out, ignore_errors=True)
    os.makedirs(out)
    if kind == "off":
        open(os.path.join(out, "trigger"), "w").close()
    cfg = os.path.join(work_dir, "cfg.json")
    with open(cfg, "w") as f:
        json.dump({"ProfilingParameters": {"LocalPath": out}}, f)
    manifest = os.path.join(work_dir, "manifest.json")
    env = {k: v for k, v in os.environ.items() if k not in CLEARED_ENV}
    env.update(
        PYTHONPATH=str(PACKAGE_DIR),
        TRAINPROF_HOOK_LIB=LIB,
        SMPROFILER_CONFIG_PATH=cfg,
        TRAINPROF_RESOURCE_CONFIG=os.path.join(work_dir, "none.json"),
        TRAINPROF_TEST_MANIFEST=manifest,
        TRAINPROF_TEST_PARAMS=json.dumps(
            {"hot_lib": hot_lib, "steps": (EMPTY_STEPS if work == "empty" else STEPS) + SKIP,
             "iterations": iterations, "work": "c", "settle_s": 0.2}
        ),
    )
    proc = subprocess.run([sys.executable, SCRIPT], env=env, capture_output=True, text=True, timeout=600)
    if proc.returncode != 0:
        sys.exit("trainer failed (%s):\n%s" % (kind, proc.stderr))
    polled = os.path.isdir(os.path.join(out, "trigger"))
    if polled != (kind == "on"):
        sys.exit("the %s run %s the trigger folder:\n%s" % (kind, "made" if polled else "did not make", proc.stderr))
    with open(manifest) as f:
        m = json.load(f)
    scale = 1e6 if work == "empty" else 1e3
    return {
        "cpu": statistics.median(m["step_cpu_s"][SKIP:]) * scale,
        "wall": statistics.median(m["step_s"][SKIP:]) * scale,
    }


def main():
    if not os.path.isfile(LIB):
        sys.exit("%s is missing: cargo build --release -p trainprof-hook" % LIB)
    work_dir = tempfile.mkdtemp(prefix="trigger-idle-")
    hot_lib = os.path.join(work_dir, "libhot.so")
    subprocess.run(
        ["cc", "-O1", "-shared", "-fPIC", "-o", hot_lib, os.path.join(ROOT, "tests", "hook", "c", "hot_loop.c")],
        check=True,
    )
    print("library %s; %d rounds × %d steps (and %d empty steps)" % (LIB, ROUNDS, STEPS, EMPTY_STEPS))
    for work in ("c", "empty"):
        iterations = 1 if work == "empty" else calibrate("c", hot_lib)
        unit = "µs" if work == "empty" else "ms"
        medians = {"off": [], "on": []}
        for r in range(ROUNDS):
            for kind in medians:
                ms = run(work_dir, kind, work, hot_lib, iterations)
                medians[kind].append(ms)
                print("  %s round %d %-3s median step: CPU %.3f %s, wall %.3f %s"
                      % (work, r, kind, ms["cpu"], unit, ms["wall"], unit))
        for what in ("cpu", "wall"):
            vals = {k: [x[what] for x in v] for k, v in medians.items()}
            p50 = {k: statistics.median(v) for k, v in vals.items()}
            spread = max(v) - min(v) if len(v := vals["off"]) > 1 else 0.0
            print("  %s %s: on %+.2f %% of off (off's spread over rounds %.3f %s)"
                  % (work, what, (p50["on"] / p50["off"] - 1) * 100, spread, unit))
            print("RESULT " + json.dumps({
                "metric": "step %s time, %s, trigger folder polled vs on-demand windows off (p50 of %d rounds)"
                % ("CPU" if what == "cpu" else "wall", "C loop" if work == "c" else "empty step", ROUNDS),
                "unit": unit,
                "trainprof": round(p50["on"], 3),
                "peer": round(p50["off"], 3),
                "peer_name": "on-demand windows off",
                "better": "lower",
            }))
    shutil.rmtree(work_dir, ignore_errors=True)


if __name__ == "__main__":
    main()
