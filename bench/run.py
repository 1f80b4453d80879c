"""Every benchmark, each side by side with its peer in the same run, and one table at the end.

    scripts/bench                 # ~5 minutes on 2 cores
    scripts/bench --quick         # shorter runs, for a smoke check (numbers are noisier)
    scripts/bench --markdown      # also BENCHMARKS.md's "## Current" section: heading (commit,
                                  # date, machine, load) and the table as Markdown

Runs, one after the other (never two at once, so that none takes CPU from another):

  hook-c       scripts/bench-hook             trainprof_record from C, ns/event; the writer's
                                              events/s when the producers run flat out
  hook-py      scripts/bench-hook-python      one timeline event from Python, trainprof vs
                                              smdebug 1.0.34's TimelineFileWriter; events/s
                                              into files
  step-py      bench/step_vs_smdebug.py       one training step's hook work from Python,
                                              trainprof vs smdebug's PyTorch hook's per-step work
  agent        scripts/bench-agent            CPU per tick and RSS, trainprof vs a psutil
                                              collector of the same metrics
  gpu          bench/gpu_cost.py              the agent's CPU per GPU per tick over the fake
                                              NVML at an H200's cost per call, 1 and 8 GPUs
                                              beside no GPU, vs the goal (150 µs)
  s3           bench/s3_latency.py            file sealed → object in S3 (moto_server), p50/p95
                                              (stretched to take in a minute boundary),
                                              vs a bare boto3 put_object of the same files
  report       bench/report_vs_smdebug.py     `trainprof report --json` + `trainprof trace` vs
                                              smdebug's MergedTimeline.merge_timeline +
                                              PandasFrame on a synthetic hour of 8 ranks
                                              (bench/synth_job.py): wall time, peak RSS.
                                              The hour takes smdebug tens of minutes; --quick
                                              uses 5 minutes of data
  fleet        bench/report_fleet.py          `trainprof report --json` over 8 and 64 ranks (5 min)
                                              vs smdebug's two readers together (8 ranks; 300 s limit)
  native       bench/native_overhead.py       step time outside and inside a 99 Hz native
                                              window vs no native config
  windows      bench/windows_after.py         step CPU after 5 windows of each kind vs a run
                                              that opens none (a cost left behind)
  faults       bench/signal_fault_cost.py     a runtime fixing its own SIGSEGVs with the flight
                                              recorder in front vs without trainprof
  hang-scan    bench/hang_scan.py             the agent's CPU after 50,000 planted dump
                                              folders vs the same agent before the planting
  trigger-idle bench/trigger_idle.py           step time with `trainprof trigger`'s folder
                                              polled (the default) vs on-demand windows off
  detailed-close bench/detailed_close.py       a torch detailed window's close and peak RSS vs
                                              plain torch.profiler + export_chrome_trace (with
                                              .venv-torch; skipped without it)

Each benchmark prints its own detailed report (kept in a log folder named at the end) and
lines ``RESULT {json}`` with: metric, unit, trainprof, peer, peer_name, better (lower |
higher). The table shows them with the ratio in trainprof's favour (> 1 = trainprof better).
"""

import argparse
import datetime
import json
import os
import platform
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# name, command, environment (full run), environment (--quick)
BENCHES = [
    ("hook-c", ["scripts/bench-hook"], {"BENCH_BATCHES": "5000"}, {"BENCH_BATCHES": "1000"}),
    ("hook-py", ["scripts/bench-hook-python"], {"BENCH_EVENTS": "100000"}, {"BENCH_EVENTS": "20000"}),
    ("step-py", [sys.executable, "bench/step_vs_smdebug.py"], {},
     {"BENCH_STEPS": "4000", "BENCH_GAP_STEPS": "1000", "BENCH_ROUNDS": "2"}),
    ("agent", ["scripts/bench-agent"], {"BENCH_SECONDS": "20"}, {"BENCH_SECONDS": "5", "BENCH_TREE": "0"}),
    ("gpu", [sys.executable, "bench/gpu_cost.py"], {"BENCH_SECONDS": "20"}, {"BENCH_SECONDS": "6", "BENCH_ROUNDS": "1"}),
    ("s3", [sys.executable, "bench/s3_latency.py"], {"BENCH_SECONDS": "20"}, {"BENCH_SECONDS": "8"}),
    ("report", [sys.executable, "bench/report_vs_smdebug.py"], {"BENCH_MINUTES": "60"}, {"BENCH_MINUTES": "5"}),
    ("fleet", [sys.executable, "bench/report_fleet.py"],
     {"BENCH_MINUTES": "5", "BENCH_NODES": "1,8", "BENCH_SMDEBUG_NODES": "1", "BENCH_SMDEBUG_LIMIT_S": "300"},
     {"BENCH_MINUTES": "1", "BENCH_NODES": "1", "BENCH_SMDEBUG_NODES": "1", "BENCH_SMDEBUG_LIMIT_S": "120"}),
    ("native", [sys.executable, "bench/native_overhead.py"], {"BENCH_ROUNDS": "3"},
     {"BENCH_ROUNDS": "1", "BENCH_STEPS": "20", "BENCH_EMPTY_STEPS": "2000"}),
    ("windows", [sys.executable, "bench/windows_after.py"], {"BENCH_ROUNDS": "3", "BENCH_STEPS": "100"},
     {"BENCH_ROUNDS": "1", "BENCH_STEPS": "30"}),
    ("faults", [sys.executable, "bench/signal_fault_cost.py"], {"BENCH_FAULTS": "200000"}, {"BENCH_FAULTS": "20000"}),
    ("hang-scan", [sys.executable, "bench/hang_scan.py"], {"BENCH_FOLDERS": "50000", "BENCH_SECONDS": "10"},
     {"BENCH_FOLDERS": "5000", "BENCH_SECONDS": "3"}),
    ("trigger-idle", [sys.executable, "bench/trigger_idle.py"], {"BENCH_ROUNDS": "5"},
     {"BENCH_ROUNDS": "1", "BENCH_STEPS": "20", "BENCH_EMPTY_STEPS": "2000"}),
    ("detailed-close", [sys.executable, "bench/detailed_close.py"], {"BENCH_ROUNDS": "3"}, {"BENCH_ROUNDS": "1"}),
]


def machine():
    cpu = "unknown CPU"
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    mem = ""
    try:
        with open("/proc/meminfo") as f:
            kib = int(f.readline().split()[1])
            mem = ", %.0f GiB" % (kib / 2**20)
    except (OSError, ValueError, IndexError):
        pass
    return "%s, %d CPUs%s, %s %s, Python %s" % (
        cpu, os.cpu_count() or 0, mem, platform.system(), platform.release(), platform.python_version())


def ratio(r):
    """How many times better trainprof is (None without a peer)."""
    mine, theirs = r.get("trainprof"), r.get("peer")
    if not isinstance(mine, (int, float)) or not isinstance(theirs, (int, float)) or mine <= 0 or theirs <= 0:
        return None
    return theirs / mine if r.get("better") == "lower" else mine / theirs


def fmt(v):
    if not isinstance(v, (int, float)):
        return "–"
    if v >= 1000:
        return "{:,.0f}".format(v)
    if v >= 10:
        return "%.1f" % v
    return "%.2f" % v


def rows_of(results):
    out = []
    for bench, r in results:
        x = ratio(r)
        out.append([bench, r["metric"], r["unit"], fmt(r.get("trainprof")), fmt(r.get("peer")),
                    ("%.1f×" if x >= 1 else "%.2g×") % x if x is not None else "–", r.get("peer_name") or "–"])
    return out


HEADER = ["bench", "metric", "unit", "trainprof", "peer", "ratio", "peer is"]


def text_table(rows):
    widths = [max(len(str(c)) for c in col) for col in zip(HEADER, *rows)]
    line = lambda cells: "  ".join(str(c).ljust(w) for c, w in zip(cells, widths)).rstrip()  # noqa: E731
    return "\n".join([line(HEADER), line("-" * w for w in widths)] + [line(r) for r in rows])


def markdown_table(rows):
    cell = lambda c: str(c).replace("|", "\\|")  # noqa: E731
    out = ["| " + " | ".join(HEADER) + " |", "|" + "---|" * len(HEADER)]
    out += ["| " + " | ".join(cell(c) for c in r) + " |" for r in rows]
    return "\n".join(out)


def commit():
    """This tree's commit, `+dirty` when it has changes; `unknown` outside git."""
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                              check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=ROOT,
                               capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return head + ("+dirty" if dirty else "")


def current_section(rows, started, quick, load, tree, failed=()):
    """BENCHMARKS.md's opening section: what ran, where, and the table (every cell from this run)."""
    out = ["## Current", "",
           "`scripts/bench --markdown`%s at %s, %s UTC; %s; load average %s at the start."
           % (" --quick" if quick else "", tree, started.strftime("%Y-%m-%d %H:%M"), machine(), load), "",
           "ratio: how many times better trainprof is than its peer (> 1 = trainprof better; lower "
           "is better for times, CPU and memory).", "",
           markdown_table(rows)]
    if failed:
        out += ["", "Did not run to the end (no row, or fewer rows): %s." % ", ".join(failed)]
    return "\n".join(out)


def load_average():
    try:
        return "%.2f" % os.getloadavg()[0]
    except OSError:
        return "unknown"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="shorter runs (a smoke check)")
    ap.add_argument("--markdown", action="store_true", help="also print the table as Markdown")
    ap.add_argument("--only", action="append", metavar="NAME",
                    help="run only these (%s); may be repeated" % ", ".join(b[0] for b in BENCHES))
    args = ap.parse_args()

    logs = tempfile.mkdtemp(prefix="trainprof-bench-")
    started = datetime.datetime.now(datetime.timezone.utc)
    load, tree = load_average(), commit()
    results, failed = [], []
    for name, argv, env_full, env_quick in BENCHES:
        if args.only and name not in args.only:
            continue
        env = dict(os.environ)
        env.update(env_quick if args.quick else env_full)
        env["TRAINPROF_BIN"] = os.path.join(ROOT, "target", "release", "trainprof")
        env["TRAINPROF_HOOK_LIB"] = os.path.join(ROOT, "target", "release", "libtrainprof_hook.so")
        env["PYTHONPATH"] = os.path.join(ROOT, "hook-ffi", "python")
        log_path = os.path.join(logs, name + ".log")
        print("== %s: %s" % (name, " ".join(argv)), flush=True)
        t0 = time.monotonic()
        with open(log_path, "w") as log:
            proc = subprocess.run(argv, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                  text=True)
            log.write(proc.stdout)
        found = 0
        for line in proc.stdout.splitlines():
            if line.startswith("RESULT "):
                try:
                    results.append((name, json.loads(line[len("RESULT "):])))
                    found += 1
                except ValueError:
                    print("   unreadable result line: %s" % line)
        print("   %d results in %.0f s%s" % (found, time.monotonic() - t0,
                                            "" if proc.returncode == 0 else ", exit status %d" % proc.returncode))
        if proc.returncode != 0 or not found:
            failed.append(name)
            print("\n".join("   | " + l for l in proc.stdout.splitlines()[-15:]))

    rows = rows_of(results)
    print()
    print("trainprof benchmarks, %s UTC%s" % (started.strftime("%Y-%m-%d %H:%M"), " (--quick)" if args.quick else ""))
    print("machine: %s" % machine())
    print()
    print(text_table(rows))
    if args.markdown:
        print()
        print(current_section(rows, started, args.quick, load, tree, failed))
    print()
    print("full reports: %s" % logs)
    if failed:
        print("FAILED: %s" % ", ".join(failed))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
