"""Benchmark (not a test): how long a sealed file waits before it is an object in S3, for
`trainprof run --s3` against a real S3-compatible server (moto_server on 127.0.0.1).

    .venv/bin/python bench/s3_latency.py        # from the repo root; TRAINPROF_BIN, BENCH_SECONDS

One run of `trainprof run --keep-local --s3 ... -- python -c TRAINER`: the trainer (the
`trainprof` package) does a step every BENCH_STEP_MS (10) ms with four events, timelines
rotated at BENCH_ROTATE_BYTES (8000): one sealed every ~160 ms. System files are sealed once
per UTC minute whatever the config says (system.rs fixes the window at 60 s;
RotateFileCloseIntervalInSeconds only rotates timelines), so BENCH_SECONDS (30) is stretched
to take in one minute boundary: the system row gets one sample per minute of run, and its
p95 is reported from 20 samples on (BENCH_SECONDS=1200).

Per file both on disk and in S3, measured from outside:
  t_sealed  st_ctime: the agent places a system file by link() + unlink() of its temporary,
            the hook a timeline by renameat2(); both set ctime, and nothing touches the file
            later (--keep-local). Checked on the 2-core dev VM (ext4, kernel 6.18): polling
            the folders every ~1 ms in a run saw all 243 names 0.3-5.3 ms after their ctime,
            none before; the check printed below (seals between two wall-clock reads) finds
            ctime never after the call but up to one timer tick (~4 ms) before it, inode times
            being the kernel's coarse clock: latencies are overstated by 0-4 ms (~2 on average).
  t_in_s3   LastModified from ListObjectsV2. moto 5.2.5 prints it to the second (.000Z), so
            moto_server starts through a wrapper that prints the same stored time
            (FakeKey.last_modified, utcnow() once the PUT's body is in) to the microsecond;
            nothing else changes and the agent never reads it. Same host and clock as ctime.
            Checked: it falls inside each of 30 boto3 PUTs' client-side spans, 2.6-6.3 ms
            after the start and 0.8 ms or more before the reply is in.
Counted: files sealed from 2 s after the trainer's first step to 3 s before its close();
those sealed at the close or later go out at the finish (shutdown path) and are shown apart.
Percentiles are nearest-rank.

Peer, "bare PUT": afterwards, the agent gone, the same files (round robin, >= 50 per kind)
PUT one at a time with boto3 put_object to the same server, timed on the client: the floor
any uploader pays here; the ratio is trainprof / bare PUT. moto answers `Connection: close`,
so every PUT, the agent's and boto3's alike, opens a TCP connection. The peer does not pay:
the walk (every 1 s, or at the sampler's wake for a system file), the folder fsync after a
seal, the timelines pending since the last walk that go out with the system file (4 at a
time, into one Python server), the CPU that trainer, sampler and moto share (2 cores here).
"""

import json
import math
import os
import pathlib
import shutil
import signal
import subprocess
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "s3"))
import s3_support as s3  # noqa: E402  (free_port, agent_env, s3_client, kill_group)

SECONDS = float(os.environ.get("BENCH_SECONDS", "30"))
STEP_MS = float(os.environ.get("BENCH_STEP_MS", "10"))
ROTATE_BYTES = int(os.environ.get("BENCH_ROTATE_BYTES", "8000"))
WARMUP_S = 2.0
TAIL_S = 3.0
PEER_PUTS = 50
BUCKET = "trainprof-bench"
PREFIX = "run"
PEER_NAME = "boto3 put_object to moto"

MOTO = r"""
import moto.core.serialize as ser
import moto.s3.models as m
us = lambda t: t.strftime("%Y-%m-%dT%H:%M:%S.%fZ")
m.FakeKey.last_modified_ISO8601 = property(lambda k: us(k.last_modified))
ser.TimestampSerializer._timestamp_iso8601_zeroed = lambda self, t: us(t)
from moto.server import main
main()
"""

TRAINER = r"""
import json, os, sys, time
import trainprof
prof = trainprof.Profiler(framework="pytorch")
if not prof.enabled:
    sys.exit("trainer: profiling is off (init status %s)" % prof.init_status)
step_s, start, k = float(os.environ["BENCH_STEP_MS"]) / 1000, time.time(), 0
while time.time() < start + float(os.environ["BENCH_RUN_S"]):
    prof.step_begin("train")
    t = prof.now_us()
    for phase, name, a, b in (("Forward", "Net", 0, 100), ("Backward", "Net", 100, 300), ("Optimizer", "SGD", 300, 400)):
        prof.record_event(phase, name, t + a, t + b)
    prof.step_end()
    k += 1
    time.sleep(max(0.0, start + k * step_s - time.time()))
close = time.time()
prof.close()
with open(os.environ["BENCH_MARKS"], "w") as f:
    json.dump({"start": start, "close": close, "steps": k}, f)
"""


def start_moto(log_path):
    """moto_server (through the LastModified wrapper) on a free port; (proc, endpoint)."""
    for _attempt in range(3):
        port = s3.free_port()
        with open(log_path, "ab") as log:
            proc = subprocess.Popen([sys.executable, "-c", MOTO, "-H", "127.0.0.1", "-p", str(port)],
                                    stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                    start_new_session=True)
        endpoint = "http://127.0.0.1:%d" % port
        deadline = time.monotonic() + s3.SERVER_START_S
        while time.monotonic() < deadline and proc.poll() is None:
            if s3._answers(endpoint):
                return proc, endpoint
            time.sleep(0.05)
        s3.kill_group(proc)
    sys.exit("moto_server did not answer; its log:\n" + log_path.read_text(errors="replace")[-2000:])


def ctime_check(folder, n=100):
    """Over n seals by rename and by link + unlink: the most ms that ctime lies before a
    wall-clock read just before the call, and the most it lies after a read just after it."""
    before = after = -math.inf
    for i in range(n):
        tmp, final = folder / ("%d.tmp" % i), folder / ("%d.json" % i)
        tmp.write_bytes(b"[]")
        time.sleep(0.003)
        t0 = time.time_ns()
        if i % 2:
            os.rename(tmp, final)
        else:  # as the agent: link, then unlink the temporary (which sets ctime again)
            os.link(tmp, final)
            os.unlink(tmp)
        t1 = time.time_ns()
        c = final.stat().st_ctime_ns
        before, after = max(before, (t0 - c) / 1e6), max(after, (c - t1) / 1e6)
    return before, after


def sealed_files(out):
    """{relative path: (kind, ctime s)} for the sealed system and timeline files under out."""
    found = {}
    for kind, sub in (("system", "system/incremental"), ("timeline", "framework/pevents")):
        for folder, _, names in os.walk(out / sub):
            for name in names:
                if name.endswith(".json"):
                    path = pathlib.Path(folder) / name
                    found[str(path.relative_to(out))] = (kind, path.stat().st_ctime_ns / 1e9)
    return found


def in_s3(client, prefix):
    """{relative path: LastModified s} for the objects under prefix/."""
    pages = client.get_paginator("list_objects_v2").paginate(Bucket=BUCKET, Prefix=prefix + "/")
    return {o["Key"][len(prefix) + 1:]: o["LastModified"].timestamp() for p in pages for o in p.get("Contents", [])}


def pct(values, p):
    """Nearest-rank percentile (None when empty)."""
    v = sorted(values)
    return v[max(0, math.ceil(p / 100 * len(v)) - 1)] if v else None


def bare_puts(client, out, rels):
    """ms per boto3 put_object of these files, round robin, at least PEER_PUTS of them."""
    bodies = [(out / rel).read_bytes() for rel in rels]
    client.put_object(Bucket=BUCKET, Key="peer/warm-up", Body=bodies[0])  # botocore set-up: not timed
    times = []
    for i in range(max(PEER_PUTS, len(bodies))):
        t0 = time.perf_counter()
        client.put_object(Bucket=BUCKET, Key="peer/%d/%s" % (i, rels[i % len(rels)]), Body=bodies[i % len(bodies)])
        times.append((time.perf_counter() - t0) * 1000)
    return times


def run_seconds():
    """BENCH_SECONDS, stretched so that a UTC minute boundary (a system seal) falls in the
    counted part of the run."""
    now = time.time()
    return max(SECONDS, math.ceil((now + 1 + WARMUP_S) / 60) * 60 - now + TAIL_S + 2)


def classify(local, remote, marks):
    """Per kind: ms of the counted files, their paths, ms of those sealed at or after the
    close; and how many counted files reached S3 after the close, how many are not counted."""
    counted, rels, finish = ({"system": [], "timeline": []} for _ in range(3))
    late = edge = 0
    for rel, (kind, t_sealed) in local.items():
        if rel in remote:
            ms = (remote[rel] - t_sealed) * 1000
            if t_sealed >= marks["close"]:
                finish[kind].append(ms)
            elif marks["start"] + WARMUP_S <= t_sealed < marks["close"] - TAIL_S:
                counted[kind].append(ms)
                rels[kind].append(rel)
                late += remote[rel] >= marks["close"]
            else:
                edge += 1
    return counted, rels, finish, late, edge


def report(counted, finish, peer):
    """The table; returns the RESULT tuples (metric, trainprof ms, peer ms)."""
    print("\n%-26s %5s %8s %8s %8s   %-19s %s" % ("sealed -> in S3 (ms)", "n", "p50", "p95", "max",
                                                "bare PUT p50 / p95", "ratio p50 / p95"))
    results = []
    for kind, label in (("system", "system file (wake)"), ("timeline", "timeline file (1 s walk)")):
        v, pv = counted[kind], peer.get(kind, [])
        if not v:
            print("%-26s %5d   (none sealed in the counted part of the run)" % (label, 0))
            continue
        p50, p95, p50p, p95p = pct(v, 50), pct(v, 95), pct(pv, 50), pct(pv, 95)
        enough = len(v) >= 20
        print("%-26s %5d %8.1f %8s %8.1f   %6.1f / %-8.1f    %s" % (
            label, len(v), p50, "%.1f" % p95 if enough else "-", max(v), p50p, p95p,
            "%.1fx / %.1fx" % (p50 / p50p, p95 / p95p) if enough else "%.1fx   (n < 20: no p95)" % (p50 / p50p)))
        if not enough:
            print("%-26s %5s   each: %s" % ("", "", ", ".join("%.1f" % x for x in sorted(v))))
        results.append(("sealed→S3 %s file p50" % kind, p50, p50p))
        if enough:
            results.append(("sealed→S3 %s file p95" % kind, p95, p95p))
    for kind, v in finish.items():
        if v:
            print("%-26s %5d %8.1f %8s %8.1f   (sealed at the trainer's close or later: shutdown path)"
                  % ("  %s at the finish" % kind, len(v), pct(v, 50), "", max(v)))
    return results


def run_trainprof(binary, endpoint, tmp):
    """`trainprof run` with the trainer, to its end (killed with it on any error); returns the
    output root, the trainer's marks and the agent's output."""
    out, cfg, marks = tmp / "out", tmp / "profilerconfig.json", tmp / "marks.json"
    cfg.write_text(json.dumps({"ProfilingParameters": {"RotateMaxFileSizeInBytes": ROTATE_BYTES}}))
    seconds = run_seconds()
    pythonpath = os.pathsep.join(filter(None, (str(ROOT / "hook-ffi" / "python"), os.environ.get("PYTHONPATH"))))
    env = s3.agent_env(endpoint, BENCH_RUN_S=seconds, BENCH_STEP_MS=STEP_MS, BENCH_MARKS=marks, PYTHONPATH=pythonpath)
    argv = [binary, "run", "--config", str(cfg), "--local-path", str(out), "--keep-local",
            "--s3", "s3://%s/%s" % (BUCKET, PREFIX), "--s3-endpoint", endpoint, "--", sys.executable, "-c", TRAINER]
    print("trainprof run for %.0f s (a step every %g ms, timelines rotated at %d bytes) ..."
          % (seconds, STEP_MS, ROTATE_BYTES), flush=True)
    with open(tmp / "agent.log", "wb") as log:
        agent = subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                 start_new_session=True)  # its group: trainprof and the trainer
    try:
        rc = agent.wait(timeout=seconds + 120)
    except subprocess.TimeoutExpired:
        rc = "still running after %.0f s" % (seconds + 120)
    finally:
        s3.kill_group(agent)
    agent_log = (tmp / "agent.log").read_text(errors="replace")
    if rc != 0 or not marks.exists():
        sys.exit("trainprof run failed (%s); its output:\n%s" % (rc, agent_log[-4000:]))
    return out, json.loads(marks.read_text()), agent_log


def main():
    binary = os.environ.get("TRAINPROF_BIN") or str(ROOT / "target" / "release" / "trainprof")
    if not os.access(binary, os.X_OK):
        sys.exit("%s not found: cargo build --release -p trainprof-agent -p trainprof-hook" % binary)
    tmp = pathlib.Path(tempfile.mkdtemp(prefix="trainprof-s3-bench-"))
    moto = None
    try:
        (tmp / "ctime").mkdir()
        ctime_before, ctime_after = ctime_check(tmp / "ctime")
        moto, endpoint = start_moto(tmp / "moto.log")
        client = s3.s3_client(endpoint)
        client.create_bucket(Bucket=BUCKET)
        out, marks, agent_log = run_trainprof(binary, endpoint, tmp)
        local = sealed_files(out)
        remote = in_s3(client, PREFIX)
        counted, rels, finish, late, edge = classify(local, remote, marks)
        peer = {k: bare_puts(client, out, sorted(v)) for k, v in rels.items() if v}

        results = report(counted, finish, peer)
        missing = sorted(rel for rel in local if rel not in remote)
        print("\nfiles: %d sealed, %d in S3, %d sealed but not in S3%s, %d in the warm-up / tail (not counted); "
              "%d steps in %.1f s" % (len(local), len(remote), len(missing), " (%s ...)" % missing[0] if missing else "",
                                      edge, marks["steps"], marks["close"] - marks["start"]))
        print("ctime check, 100 seals: ctime up to %.1f ms before the call (coarse clock), %s"
              % (ctime_before, "never after it" if ctime_after <= 0 else "UP TO %.2f ms AFTER IT" % ctime_after))
        if all(t == int(t) for t in remote.values()):
            print("note: no LastModified had a fraction of a second: the moto wrapper did not apply")
        if late:
            print("note: %d counted files reached S3 only after the trainer's close()" % late)
        print("\n".join("agent: " + line for line in agent_log.splitlines() if line.startswith("trainprof: upload:")))
        print()
        for metric, value, peer_value in results:
            print("RESULT " + json.dumps({"metric": metric, "unit": "ms", "trainprof": round(value, 2),
                                          "peer": round(peer_value, 2), "peer_name": PEER_NAME,
                                          "better": "lower"}, ensure_ascii=False))
    finally:
        if moto is not None:
            s3.kill_group(moto)
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    signal.signal(signal.SIGTERM, lambda *_: sys.exit("stopped by SIGTERM"))  # so that cleanup runs
    main()
