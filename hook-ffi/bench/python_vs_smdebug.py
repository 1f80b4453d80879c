"""Benchmark (not a test): the cost, on the training thread, of recording one timeline
event from Python, trainprof vs smdebug 1.0.34's own writer, side by side in one run.

    scripts/bench-hook-python        # builds the release library, runs this with .venv

Both write the same events ("Forward"/"Net", step_num, pid) with the same rotation limits
into separate temporary folders; the time measured is the call on the training thread
(smdebug's TimelineFileWriter.write_trace_events blocks when its 100-entry queue is full;
trainprof's Profiler.record_event never blocks and drops and counts instead). Each side is
also timed until its files are complete (close), and the events found in the files are
counted.
"""

import glob
import json
import os
import shutil
import sys
import tempfile
import time

N = int(os.environ.get("BENCH_EVENTS", "200000"))
BATCH = 100


def pick(sorted_values, q):
    return sorted_values[min(len(sorted_values) - 1, int(q * len(sorted_values)))]


def percentiles(per_call_ns):
    s = sorted(per_call_ns)
    return "p50 %7.0f  p90 %7.0f  p99 %7.0f ns/event" % (pick(s, 0.5), pick(s, 0.9), pick(s, 0.99))


def result(metric, unit, mine, theirs, better):
    """One line for bench/run.py (scripts/bench)."""
    print("RESULT " + json.dumps({"metric": metric, "unit": unit, "trainprof": mine, "peer": theirs,
                                  "peer_name": "smdebug 1.0.34 TimelineFileWriter", "better": better}))


def count_events(root):
    n = 0
    for path in glob.glob(os.path.join(root, "framework", "pevents", "*", "*.json")):
        with open(path) as f:
            n += sum(1 for e in json.load(f) if e.get("ph") == "X")
    return n


def run(label, record, close, root):
    batches = []
    t_all = time.perf_counter_ns()
    for b in range(N // BATCH):
        t0 = time.perf_counter_ns()
        for i in range(BATCH):
            record(b * BATCH + i)
        batches.append((time.perf_counter_ns() - t0) / BATCH)
    t_calls = time.perf_counter_ns() - t_all
    close()
    t_done = time.perf_counter_ns() - t_all
    in_files = count_events(root)
    print("%-10s %s   calls %.2f s, until files complete %.2f s, events in files %d of %d"
          % (label, percentiles(batches), t_calls / 1e9, t_done / 1e9, in_files, N))
    s = sorted(batches)
    return {"p50": pick(s, 0.5), "p99": pick(s, 0.99), "events_per_s": in_files * 1e9 / t_done}


def use_config(tmp, name):
    """Writes a config with LocalPath <tmp>/<name>, points SMPROFILER_CONFIG_PATH at it."""
    root = os.path.join(tmp, name)
    params = {"LocalPath": root, "RotateMaxFileSizeInBytes": 10485760, "RotateFileCloseIntervalInSeconds": 60}
    path = os.path.join(tmp, name + ".json")
    with open(path, "w") as f:
        json.dump({"ProfilingParameters": params}, f)
    os.environ["SMPROFILER_CONFIG_PATH"] = path
    return root


def main():
    tmp = tempfile.mkdtemp(prefix="trainprof-pybench-")

    # smdebug 1.0.34
    sm_root = use_config(tmp, "smdebug")
    from smdebug.core.tfevent.timeline_file_writer import TimelineFileWriter
    from smdebug.profiler.profiler_config_parser import ProfilerConfigParser

    writer = TimelineFileWriter(profiler_config_parser=ProfilerConfigParser())
    pid = os.getpid()
    base = time.time()
    sm = run(
        "smdebug",
        lambda i: writer.write_trace_events(
            timestamp=base + i * 1e-5, training_phase="Forward", op_name="Net", duration=1e-6,
            pid=pid, step_num=str(i // 1000),
        ),
        writer.close,
        sm_root,
    )

    # trainprof
    tp_root = use_config(tmp, "trainprof")
    import trainprof

    prof = trainprof.Profiler(framework="pytorch")
    start_us = int(base * 1e6)
    tp = run(
        "trainprof",
        lambda i: prof.record_event("Forward", "Net", start_us + 10 * i, start_us + 10 * i + 1, step=i // 1000),
        prof.close,
        tp_root,
    )
    print("trainprof dropped (queue full): %d" % prof.stats()["dropped_queue_full"])
    result("record one event from Python, p50", "ns/event", round(tp["p50"]), round(sm["p50"]), "lower")
    result("record one event from Python, p99", "ns/event", round(tp["p99"]), round(sm["p99"]), "lower")
    result("timeline events in files per second (Python producer)", "events/s",
           round(tp["events_per_s"]), round(sm["events_per_s"]), "higher")
    shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
