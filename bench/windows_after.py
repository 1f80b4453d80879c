"""Do windows leave a cost behind? The steady-state step time of a CPU-bound trainer before
its first window and after its last, side by side, for 5 windows of each kind (detailed,
dataloader, Python with cProfile and with pyinstrument, native) and for all kinds together,
with a run that opens no window as the peer.

    python bench/windows_after.py          # BENCH_ROUNDS=3 BENCH_STEPS=200 BENCH_CPU_MS=10
    BENCH_WORK=c python bench/windows_after.py

The trainer is tests/hook/scripts/windows_trainer.py (through trainprof.torch, with a small
torch model when torch is importable): each step is a forward through the adapter's hooks,
a batch from the profiled loader and BENCH_CPU_MS of CPU in a pure-Python loop (default:
a profile function left behind would slow it most) or a C loop (BENCH_WORK=c). It times
BENCH_STEPS steps after 5 warm-up steps, opens the windows (each after a hot reload of the
config), then times BENCH_STEPS steps again. Each configuration runs BENCH_ROUNDS times, in
turn with the others; per run the median step, then the median of the runs. Uses the
release library (target/release/libtrainprof_hook.so, or TRAINPROF_HOOK_LIB). The table
also gives the growth of the heap (RssAnon) from before the first window (after the native
sampler's warm-up) to the end. Not a test: nothing is asserted. Prints a Markdown table, and
`RESULT {json}` lines for bench/run.py (step CPU after the windows against no window).
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

from trainer_runs import CLEARED_ENV, PACKAGE_DIR, profiler_config  # noqa: E402

ROUNDS = int(os.environ.get("BENCH_ROUNDS", "3"))
STEPS = int(os.environ.get("BENCH_STEPS", "200"))
CPU_MS = float(os.environ.get("BENCH_CPU_MS", "10"))
WORK = os.environ.get("BENCH_WORK", "python")
WINDOWS = 5
LIB = os.environ.get("TRAINPROF_HOOK_LIB") or os.path.join(ROOT, "target", "release", "libtrainprof_hook.so")
SCRIPT = os.path.join(ROOT, "tests", "hook", "scripts", "windows_trainer.py")
KINDS = ["detailed", "dataloader", "cprofile", "pyinstrument", "native"]
FAR = json.dumps({"StartStep": 10**9, "NumSteps": 1})


def configurations():
    """(label, kinds, rounds): no window, each kind alone, all kinds."""
    have_pyinstrument = subprocess.run([sys.executable, "-c", "import pyinstrument"], capture_output=True).returncode == 0
    kinds = [k for k in KINDS if k != "pyinstrument" or have_pyinstrument]
    return [("no window", ["none"], 1)] + [(k, [k], WINDOWS) for k in kinds] + [("all kinds", kinds, WINDOWS)]


def run(kinds, rounds, hot_lib):
    work = tempfile.mkdtemp(prefix="trainprof-bench-windows-")
    try:
        out = os.path.join(work, "out")
        params = {"kinds": kinds, "rounds": rounds, "cpu_ms": CPU_MS, "measure_steps": STEPS}
        if hot_lib:
            params["hot_lib"] = hot_lib
        doc = profiler_config(out)
        for key in ("DetailedProfilingConfig", "DataloaderProfilingConfig", "PythonProfilingConfig"):
            doc["ProfilingParameters"][key] = FAR
        doc["ProfilingParameters"]["NativeProfilingConfig"] = FAR
        config = os.path.join(work, "profilerconfig.json")
        with open(config, "w") as f:
            json.dump(doc, f)
        manifest = os.path.join(work, "manifest.json")
        env = {k: v for k, v in os.environ.items() if k not in CLEARED_ENV}
        env.update(
            PYTHONPATH=str(PACKAGE_DIR),
            TRAINPROF_HOOK_LIB=LIB,
            TRAINPROF_RESOURCE_CONFIG=os.path.join(work, "no-resourceconfig.json"),
            TRAINPROF_TEST_MANIFEST=manifest,
            TRAINPROF_TEST_PARAMS=json.dumps(params),
            SMPROFILER_CONFIG_PATH=config,
            PYTHONDONTWRITEBYTECODE="1",
        )
        proc = subprocess.run([sys.executable, SCRIPT], env=env, cwd=work, capture_output=True, text=True, timeout=900)
        if proc.returncode != 0:
            sys.exit("windows_trainer.py failed (%d):\n%s" % (proc.returncode, proc.stderr[-4000:]))
        with open(manifest) as f:
            return json.load(f)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def build_hot_lib():
    d = tempfile.mkdtemp(prefix="trainprof-bench-hot-")
    lib = os.path.join(d, "libhot.so")
    src = os.path.join(ROOT, "tests", "hook", "c", "hot_loop.c")
    subprocess.run(["cc", "-O1", "-shared", "-fPIC", "-o", lib, src], check=True)
    return lib


def pct(a, b):
    return "%+.1f %%" % ((a / b - 1) * 100)


def main():
    if not os.path.isfile(LIB):
        sys.exit("%s does not exist: cargo build --release -p trainprof-hook" % LIB)
    hot_lib = build_hot_lib() if WORK == "c" else None
    confs = configurations()
    results = {label: [] for label, _, _ in confs}
    for r in range(ROUNDS):
        for label, kinds, rounds in confs:
            m = run(kinds, rounds, hot_lib)
            results[label].append(m)
            print(
                "round %d %-11s wall %.3f -> %.3f ms, cpu %.3f -> %.3f ms"
                % (
                    r + 1,
                    label,
                    m["step_wall_ms_before"],
                    m["step_wall_ms_after"],
                    m["step_cpu_ms_before"],
                    m["step_cpu_ms_after"],
                ),
                file=sys.stderr,
                flush=True,
            )
    torch = results["no window"][0]["torch"]
    print(
        "\n%d rounds, %d steps timed before and after, %s ms of %s work per step, torch %s\n"
        % (ROUNDS, STEPS, CPU_MS, WORK, "yes" if torch else "no")
    )
    print(
        "| windows | step wall before | after | after vs before | step CPU before | after | after vs before "
        "| heap (RssAnon) after − before |"
    )
    print("|---|---|---|---|---|---|---|---|")
    # The peer of each configuration in bench/run.py's table: the run that opens no window,
    # after the same number of steps (its "after").
    base_cpu = statistics.median(m["step_cpu_ms_after"] for m in results["no window"])
    results_lines = []
    for label, kinds, rounds in confs:
        ms = results[label]
        wb = statistics.median(m["step_wall_ms_before"] for m in ms)
        wa = statistics.median(m["step_wall_ms_after"] for m in ms)
        cb = statistics.median(m["step_cpu_ms_before"] for m in ms)
        ca = statistics.median(m["step_cpu_ms_after"] for m in ms)
        rss = statistics.median(m["rss_kb_after"] - m["rss_kb_before"] for m in ms) / 1024
        name = label if label == "no window" else "%s × %d" % (label, rounds)
        print(
            "| %s | %.3f ms | %.3f ms | %s | %.3f ms | %.3f ms | %s | %+.1f MiB |"
            % (name, wb, wa, pct(wa, wb), cb, ca, pct(ca, cb), rss)
        )
        if label != "no window":
            results_lines.append({"metric": "step CPU after %s (steady state, %s work)" % (name, WORK), "unit": "ms",
                                  "trainprof": round(ca, 3), "peer": round(base_cpu, 3),
                                  "peer_name": "no window, same steps", "better": "lower"})
    for r in results_lines:
        print("RESULT " + json.dumps(r))


if __name__ == "__main__":
    main()
