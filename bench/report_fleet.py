"""`trainprof report` over 8, 64 and 512 ranks (1, 8 and 64 nodes × 8 ranks, written by
`bench/synth_job.py --nodes N`), beside smdebug 1.0.34's readers (`MergedTimeline.merge_timeline`
and `PandasFrame`, as `bench/report_vs_smdebug.py` runs them) on the sizes they finish within
a time limit and a memory limit (BENCH_SMDEBUG_LIMIT_S, 900; BENCH_SMDEBUG_MEM_GB, 8: past it
the reader fails with MemoryError and its row says so).

    TRAINPROF_BIN=target/release/trainprof python bench/report_fleet.py
    BENCH_MINUTES=10 BENCH_NODES=1,8,64 BENCH_SMDEBUG_NODES=1,8 BENCH_SMDEBUG_LIMIT_S=900 …
    BENCH_S3_ENDPOINT=http://127.0.0.1:PORT BENCH_S3_BUCKET=b BENCH_S3_NODES=64 …  # also from S3

Each command runs in its own child process, one at a time; wall time from the parent, peak RSS
and CPU time from the child's own rusage (os.wait4). A child past its limit is killed and its
row reads "over N s". With BENCH_S3_ENDPOINT the jobs of BENCH_S3_NODES are uploaded to that
S3-compatible server (credentials from the environment) and reported from `s3://` too.
Prints a table and, per size, `RESULT {json}` lines (wall time, peak RSS) for bench/run.py.
"""

import json
import os
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "bench"))

from report_vs_smdebug import SMDEBUG_MERGE, SMDEBUG_PANDAS  # noqa: E402


def run_limited(argv, limit_s, log, env=None, mem_gb=None):
    """(wall s, peak RSS MiB, exit status or None when killed at the limit, CPU s); `mem_gb`:
    an address-space limit (RLIMIT_AS), so that a reader that would take the machine's memory
    fails with MemoryError instead."""
    def limit():
        if mem_gb:
            resource.setrlimit(resource.RLIMIT_AS, (int(mem_gb * 2**30),) * 2)

    t0 = time.monotonic()
    proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True,
                            preexec_fn=limit)
    while True:
        pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
        if pid:
            break
        if time.monotonic() - t0 > limit_s:
            os.killpg(proc.pid, signal.SIGKILL)
            _, status, usage = os.wait4(proc.pid, 0)
            return time.monotonic() - t0, usage.ru_maxrss / 1024.0, None, usage.ru_utime + usage.ru_stime
        time.sleep(0.05)
    return (time.monotonic() - t0, usage.ru_maxrss / 1024.0, os.waitstatus_to_exitcode(status),
            usage.ru_utime + usage.ru_stime)


def last_line(path):
    with open(path, errors="replace") as f:
        lines = [x.strip() for x in f if x.strip()]
    return lines[-1][:120] if lines else ""


def upload(data, endpoint, bucket, prefix):
    import concurrent.futures

    import boto3
    from botocore.config import Config

    client = boto3.client("s3", endpoint_url=endpoint, config=Config(s3={"addressing_style": "path"}))
    files = [os.path.join(d, f) for d, _, fs in os.walk(data) for f in fs]
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda p: client.upload_file(p, bucket, "%s/%s" % (prefix, os.path.relpath(p, data))), files))


def main():
    minutes = float(os.environ.get("BENCH_MINUTES", "10"))
    nodes_list = [int(n) for n in os.environ.get("BENCH_NODES", "1,8,64").split(",")]
    sm_nodes = {int(n) for n in os.environ.get("BENCH_SMDEBUG_NODES", "1,8").split(",") if n}
    sm_limit = float(os.environ.get("BENCH_SMDEBUG_LIMIT_S", "900"))
    sm_mem = float(os.environ.get("BENCH_SMDEBUG_MEM_GB", "8"))
    s3_endpoint = os.environ.get("BENCH_S3_ENDPOINT")
    s3_bucket = os.environ.get("BENCH_S3_BUCKET", "")
    s3_nodes = {int(n) for n in os.environ.get("BENCH_S3_NODES", "64").split(",") if n}
    binary = os.environ.get("TRAINPROF_BIN", os.path.join(ROOT, "target", "release", "trainprof"))
    work = tempfile.mkdtemp(prefix="trainprof-fleet-bench-")
    rows = []
    try:
        for nodes in nodes_list:
            data = os.path.join(work, "job%d" % nodes)
            t0 = time.monotonic()
            gen = subprocess.run([sys.executable, os.path.join(ROOT, "bench", "synth_job.py"), data, "--minutes",
                                  str(minutes), "--nodes", str(nodes)], check=True, stdout=subprocess.PIPE, text=True)
            info = json.loads(gen.stdout.strip().splitlines()[-1])
            size = sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(data) for f in fs)
            print("data: %.0f min, %d nodes, %d ranks: %d system lines, %d timeline events, %d steps, %.0f MB, "
                  "written in %.0f s" % (minutes, nodes, 8 * nodes, info["system_lines"], info["timeline_events"],
                                         info["steps"], size / 1e6, time.monotonic() - t0), flush=True)
            ranks = 8 * nodes
            runs = [("trainprof", "report --json", [binary, "report", data, "--json"], 3600)]
            if s3_endpoint and nodes in s3_nodes:
                upload(data, s3_endpoint, s3_bucket, "fleet%d" % nodes)
                runs.append(("trainprof", "report --json (s3://)",
                             [binary, "report", "s3://%s/fleet%d" % (s3_bucket, nodes), "--json",
                              "--s3-endpoint", s3_endpoint], 3600))
            if nodes in sm_nodes:
                merged = os.path.join(work, "merged%d" % nodes)
                os.makedirs(merged)
                runs.append(("smdebug", "MergedTimeline.merge_timeline",
                             [sys.executable, "-c", SMDEBUG_MERGE, data, merged, str(int(info["start_s"] * 1e6)),
                              str(int(info["end_s"] * 1e6))], sm_limit))
                runs.append(("smdebug", "PandasFrame (system + framework)",
                             [sys.executable, "-c", SMDEBUG_PANDAS, data], sm_limit))
            for side, what, argv, limit in runs:
                with open(os.path.join(work, "log"), "w") as log:
                    wall, rss, rc, cpu = run_limited(argv, limit, log, mem_gb=sm_mem if side == "smdebug" else None)
                note = "CPU %.1f s" % cpu if rc == 0 else ("over %.0f s: killed" % limit if rc is None
                                                             else "exit %d (%s)" % (rc, last_line(log.name)))
                rows.append((ranks, side, what, wall if rc == 0 else None, rss if rc == 0 else None, note))
                print("%4d ranks  %-10s %-34s %8s s %9s MiB  %s" % (ranks, side, what, "%.1f" % wall,
                                                                     "%.0f" % rss, note), flush=True)
            # One line per size for bench/run.py: `report --json` against smdebug's two readers
            # together (the time of both, the larger peak), when all three finished.
            done = {(side, what): (wall, rss) for r_, side, what, wall, rss, _ in rows if r_ == ranks and wall is not None}
            mine = done.get(("trainprof", "report --json"))
            theirs = [v for (side, _), v in done.items() if side == "smdebug"]
            both = len(theirs) == 2
            peer_name = ("smdebug merge_timeline + PandasFrame" if both else
                         "smdebug: not run" if nodes not in sm_nodes else "smdebug: did not finish")
            if mine:
                for i, (what, unit) in enumerate((("wall", "s"), ("peak RSS", "MiB"))):
                    peer = (sum(v[0] for v in theirs) if i == 0 else max(v[1] for v in theirs)) if both else None
                    print("RESULT " + json.dumps({"metric": "report, %d ranks x %.0f min, %s" % (ranks, minutes, what),
                                                  "unit": unit, "trainprof": round(mine[i], 2), "peer": peer and round(peer, 2),
                                                  "peer_name": peer_name, "better": "lower"}))
            shutil.rmtree(data, ignore_errors=True)
        return 0
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
