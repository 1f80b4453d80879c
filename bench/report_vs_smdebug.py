"""`trainprof report` + `trainprof trace` against smdebug 1.0.34's MergedTimeline.merge_timeline +
PandasFrame, side by side in one run, on the same synthetic hour of an 8-rank job.

    python bench/report_vs_smdebug.py             # an hour (BENCH_MINUTES=60), written by bench/synth_job.py
    BENCH_MINUTES=5 python bench/report_vs_smdebug.py
    BENCH_DATA=DIR python bench/report_vs_smdebug.py    # an existing LocalPath instead

Each side runs in its own child process, one after the other (never two at once); wall time
from the parent, peak RSS and CPU time (user + system) from the child's own rusage (os.wait4). trainprof's binary is
TRAINPROF_BIN; without it, or without its `report` / `trace` commands, its rows read "missing".

smdebug's side, per the issue: `MergedTimeline(path).merge_timeline(start_us, end_us)` (the
merged Chrome trace of every rank, with its default system-metrics filter, which reads the system
metrics through PandasFrame too) and `PandasFrame(path)` with `get_all_system_metrics()` and
`get_all_framework_metrics()` (every system and framework event as DataFrames, the input of
smdebug's analysis notebooks). That is less than `trainprof report` does (no statistics, no
findings, no page), so the ratio understates the difference. Goal: >= 20x faster, <= 1/10 memory.
Prints a table and lines `RESULT {json}` for bench/run.py.
"""

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

SMDEBUG_MERGE = """
import sys
from smdebug.profiler.analysis.utils.merge_timelines import MergedTimeline
path, out, start_us, end_us = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
MergedTimeline(path, output_directory=out).merge_timeline(start_us, end_us)
"""

SMDEBUG_PANDAS = """
import sys
from smdebug.profiler.analysis.utils.profiler_data_to_pandas import PandasFrame
pf = PandasFrame(sys.argv[1])
system = pf.get_all_system_metrics()
framework = pf.get_all_framework_metrics()
print("rows: system %d, framework %d" % (len(system), len(framework)))
"""


def run_child(argv, log):
    """(wall s, peak RSS MiB, exit status, CPU s) of one child process."""
    t0 = time.monotonic()
    proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.monotonic() - t0
    proc.returncode = os.waitstatus_to_exitcode(status)
    return wall, usage.ru_maxrss / 1024.0, proc.returncode, usage.ru_utime + usage.ru_stime


def tail(path, n=8):
    with open(path, errors="replace") as f:
        return "".join(f.readlines()[-n:])


def main():
    minutes = float(os.environ.get("BENCH_MINUTES", "60"))
    work = tempfile.mkdtemp(prefix="trainprof-report-bench-")
    data = os.environ.get("BENCH_DATA")
    try:
        if not data:
            data = os.path.join(work, "job")
            t0 = time.monotonic()
            gen = subprocess.run([sys.executable, os.path.join(ROOT, "bench", "synth_job.py"), data,
                                  "--minutes", str(minutes)], check=True, stdout=subprocess.PIPE, text=True)
            info = json.loads(gen.stdout.strip().splitlines()[-1])
            size = sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(data) for f in fs)
            print("data: %.0f min of 1 node (8 GPUs) and 8 ranks: %d system lines, %d timeline events, "
                  "%d steps, %.0f MB, written in %.0f s"
                  % (minutes, info["system_lines"], info["timeline_events"], info["steps"], size / 1e6,
                     time.monotonic() - t0))
            start_us, end_us = int(info["start_s"] * 1e6), int(info["end_s"] * 1e6)
        else:
            start_us, end_us = 0, 2**62
            print("data: %s" % data)

        rows = []  # (side, what, wall, rss) with None for missing
        binary = os.environ.get("TRAINPROF_BIN", "")
        tp = [("report --json", [binary, "report", data, "--json"]),
              ("trace", [binary, "trace", data, "-o", os.path.join(work, "trace.json.gz")])]
        for what, argv in tp:
            if not binary or not os.access(binary, os.X_OK):
                rows.append(("trainprof", what, None, None, "missing (no TRAINPROF_BIN)"))
                continue
            log = os.path.join(work, "trainprof-%s.log" % what.split()[0])
            with open(log, "w") as f:
                wall, rss, rc, cpu = run_child(argv, f)
            if rc != 0:
                rows.append(("trainprof", what, None, None, "missing (exit %d: %s)" % (rc, tail(log, 2).strip())))
            else:
                rows.append(("trainprof", what, wall, rss, "CPU %.2f s" % cpu))

        env_py = sys.executable
        for what, code, extra in [("MergedTimeline.merge_timeline", SMDEBUG_MERGE,
                                   [os.path.join(work, "merged"), str(start_us), str(end_us)]),
                                  ("PandasFrame (system + framework)", SMDEBUG_PANDAS, [])]:
            if extra:
                os.makedirs(extra[0], exist_ok=True)
            log = os.path.join(work, "smdebug-%s.log" % what.split()[0].split(".")[0])
            with open(log, "w") as f:
                wall, rss, rc, cpu = run_child([env_py, "-c", code, data] + extra, f)
            if rc != 0:
                print("smdebug %s failed (exit %d):\n%s" % (what, rc, tail(log)))
                rows.append(("smdebug", what, None, None, "failed (exit %d)" % rc))
            else:
                rows.append(("smdebug", what, wall, rss, "CPU %.2f s" % cpu))

        def total(side):
            r = [x for x in rows if x[0] == side]
            if any(x[2] is None for x in r):
                return None, None
            return sum(x[2] for x in r), max(x[3] for x in r)

        tp_wall, tp_rss = total("trainprof")
        sm_wall, sm_rss = total("smdebug")
        print()
        print("%-10s %-34s %10s %14s  %s" % ("side", "what", "wall s", "peak RSS MiB", ""))
        for side, what, wall, rss, note in rows:
            print("%-10s %-34s %10s %14s  %s" % (side, what, "%.2f" % wall if wall is not None else "missing",
                                                  "%.1f" % rss if rss is not None else "missing", note))
        print("%-10s %-34s %10s %14s" % ("trainprof", "both (sum; max)", "%.2f" % tp_wall if tp_wall else "missing",
                                         "%.1f" % tp_rss if tp_rss else "missing"))
        print("%-10s %-34s %10s %14s" % ("smdebug", "both (sum; max)", "%.2f" % sm_wall if sm_wall else "failed",
                                         "%.1f" % sm_rss if sm_rss else "failed"))
        if tp_wall and sm_wall:
            print("\ntrainprof is %.1fx faster (goal >= 20x) and uses %.3g of smdebug's peak memory (goal <= 0.1)"
                  % (sm_wall / tp_wall, tp_rss / sm_rss))
        else:
            print("\nno ratio: trainprof's side is missing")
        peer = "smdebug 1.0.34 merge_timeline + PandasFrame"
        print("RESULT " + json.dumps({"metric": "report+trace, %.0f min x 8 ranks, wall" % minutes, "unit": "s",
                                      "trainprof": tp_wall, "peer": sm_wall, "peer_name": peer, "better": "lower"}))
        print("RESULT " + json.dumps({"metric": "report+trace, %.0f min x 8 ranks, peak RSS" % minutes, "unit": "MiB",
                                      "trainprof": tp_rss, "peer": sm_rss, "peer_name": peer, "better": "lower"}))
        return 0 if sm_wall else 1
    finally:
        if os.environ.get("BENCH_KEEP"):
            print("kept: %s" % work)
        else:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
