"""Benchmark (not a test): the hook's own figure against plain vs profiled, side by side.

    .venv/bin/python bench/hook_cost.py TRAINPROF_BIN HOOK_LIB [ROUNDS] [STEPS] [EXTRA]

Runs tests/hook/scripts/cost_loop.py (pure Python busy work per step, timed from outside
with time.perf_counter_ns around each step) alternately plain and with the hook attached
(no window), ROUNDS times each (default 3), STEPS steps (default 2000) and EXTRA extra
``active("detailed")`` calls a step (default 0). Per round: the plain and profiled median
step (µs), their difference, and the hook's own time per step from ``trainprof report
--json`` (``profiling_cost.ranks[].hook.us_per_step``, docs/report.md, "What profiling
cost"), with its share of the median step.
"""

import json
import os
import pathlib
import statistics
import subprocess
import sys
import tempfile

ROOT = pathlib.Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "tests" / "hook" / "scripts" / "cost_loop.py"


def run(mode, steps, extra, lib, out):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TRAINPROF_", "SMPROFILER_"))}
    env.update(PYTHONPATH=str(ROOT / "hook-ffi" / "python"), TRAINPROF_HOOK_LIB=lib, TRAINPROF_LOCAL_PATH=out)
    p = subprocess.run([sys.executable, str(SCRIPT), mode, str(steps), str(extra)],
                       capture_output=True, text=True, env=env, check=True)
    return statistics.median(json.loads(p.stdout.splitlines()[-1])["step_ns"]) / 1000.0


def hook_figure(binary, out):
    p = subprocess.run([binary, "report", out, "--json"], capture_output=True, text=True, check=True)
    ranks = [r for r in json.loads(p.stdout)["profiling_cost"]["ranks"] if r["hook"]]
    return ranks[0]["hook"]


def main():
    binary, lib = sys.argv[1], sys.argv[2]
    rounds = int(sys.argv[3]) if len(sys.argv) > 3 else 3
    steps = int(sys.argv[4]) if len(sys.argv) > 4 else 2000
    extra = int(sys.argv[5]) if len(sys.argv) > 5 else 0
    print("round  plain µs  profiled µs  diff µs  hook µs/step  hook % of step")
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(rounds):
            plain = run("plain", steps, extra, lib, os.path.join(tmp, "p%d" % i))
            out = os.path.join(tmp, "h%d" % i)
            prof = run("profiled", steps, extra, lib, out)
            h = hook_figure(binary, out)
            print("%5d  %8.2f  %11.2f  %7.2f  %12.2f  %14.3f"
                  % (i, plain, prof, prof - plain, h["us_per_step"], h["step_percent"]))


if __name__ == "__main__":
    main()
