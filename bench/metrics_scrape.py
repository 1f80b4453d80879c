"""What one scrape of the metrics endpoint costs against what one tick costs
(BENCHMARKS.md, "The metrics endpoint"): `trainprof agent --metrics-listen` over the fake NVML
(two GPUs), scraped once per tick for DURATION seconds, each scrape after a new tick (so every
one renders); the CPU time of the server thread (`trainprof-metri…`) per scrape against the
sampling thread's (`trainprof-sampl…`) per tick, from /proc/<pid>/task/<tid>/schedstat (ns).

    python3 bench/metrics_scrape.py TRAINPROF_BIN [DURATION_S] [openmetrics] [fresh] [idle] [ranks=N]
"""

import fcntl
import http.client
import pathlib
import subprocess
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "agent"))
from metrics_support import Agent  # noqa: E402


def thread_ns(pid):
    """{thread name: CPU ns} of the agent's threads."""
    out = {}
    for t in pathlib.Path(f"/proc/{pid}/task").iterdir():
        try:
            name = (t / "comm").read_text().strip()
            out[name] = out.get(name, 0) + int((t / "schedstat").read_text().split()[0])
        except OSError:
            pass
    return out


def main():
    trainprof = pathlib.Path(sys.argv[1]).resolve()
    duration = float(sys.argv[2]) if len(sys.argv) > 2 else 20.0
    om = "openmetrics" in sys.argv[3:]
    # One connection kept alive, as Prometheus does; `fresh`: a new connection per scrape.
    fresh = "fresh" in sys.argv[3:]
    # `idle`: no scrape at all; what the server thread costs per tick just taking the ticks.
    idle = "idle" in sys.argv[3:]
    # `ranks=N`: N ranks' open timelines of 1 MiB each under LocalPath (the progress
    # families read each one's head and last 256 KiB, at most once a second).
    ranks = next((int(a.split("=")[1]) for a in sys.argv[3:] if a.startswith("ranks=")), 0)
    work = pathlib.Path(tempfile.mkdtemp(prefix="trainprof-bench-metrics-"))
    held = []
    if ranks:
        fw = work / "profiler" / "framework"
        fw.mkdir(parents=True)
        base = int(time.time() * 1e6)
        for r in range(ranks):
            lines = ['[', '{"name": "process_name", "ph": "M", "pid": 0, "args": {"start_time_since_epoch_in_micros": %d}}' % base]
            k = 0
            while sum(len(l) for l in lines) < 1 << 20:
                lines.append('{"name": "Net", "pid": 1, "ph": "X", "ts": %d, "dur": 10, "args": {"pid": 7, "step_num": "%d"}}' % (k * 1000, k))
                lines.append('{"name": "Step:ModeKeys.TRAIN", "pid": 2, "ph": "X", "ts": %d, "dur": 900, "args": {"pid": 7, "step_num": "%d"}}' % (k * 1000, k))
                k += 1
            f = open(fw / f"{r}-algo-1_pythontimeline.json.{100 + r}-1.tmp", "w")
            f.write(",\n".join(lines))
            f.flush()
            # Held as a live writer holds it, so that the agent's repair leaves it alone.
            fcntl.flock(f, fcntl.LOCK_EX)
            held.append(f)
    nvml = work / "libnvidia-ml.so.1"
    subprocess.run(["cc", "-shared", "-fPIC", "-O2", "-o", str(nvml), str(ROOT / "agent/tests/c/fake_nvml.c")], check=True)
    agent = Agent(trainprof, nvml, work / "profiler", interval_ms=100)
    headers = {"Accept": "application/openmetrics-text;version=1.0.0"} if om else {}
    try:
        agent.wait_for_tick()
        time.sleep(1)
        before = thread_ns(agent.proc.pid)
        scrapes, size, last_ts = 0, 0, None
        t0 = time.time()
        conn = None
        while idle and time.time() - t0 < duration:
            time.sleep(0.1)
        while not idle and time.time() - t0 < duration:
            if conn is None or fresh:
                if conn is not None:
                    conn.close()
                conn = http.client.HTTPConnection("127.0.0.1", agent.port, timeout=5)
            conn.request("GET", "/metrics", headers=headers)
            r = conn.getresponse()
            body = r.read()
            ts = next(l for l in body.split(b"\n") if l.startswith(b"trainprof_tick_timestamp_seconds{"))
            if ts != last_ts:
                scrapes += 1
                last_ts = ts
            size = len(body)
            time.sleep(0.1)
        after = thread_ns(agent.proc.pid)
        if conn is not None:
            conn.close()
        elapsed = time.time() - t0
    finally:
        agent.stop()
    ticks = elapsed / agent.interval_s
    server = (after.get("trainprof-metri", 0) - before.get("trainprof-metri", 0)) / 1e3
    sampler = (after.get("trainprof-sampl", 0) - before.get("trainprof-sampl", 0)) / 1e3
    if idle:
        print(f"no scrapes: server thread {server / ticks:.1f} µs CPU per tick (taking the ticks); "
              f"sampling thread {sampler / ticks:.0f} µs CPU per tick (~{ticks:.0f} ticks)")
        return
    series = sum(1 for l in body.split(b"\n") if l and not l.startswith(b"#"))
    assert not ranks or body.count(b"trainprof_step_last{") == ranks, body
    print(f"{'OpenMetrics' if om else 'text 0.0.4'}, {'a connection per scrape' if fresh else 'kept alive'}, {ranks} ranks' timelines: {scrapes} scrapes of distinct ticks in {elapsed:.1f} s; "
          f"{series} series, {size} bytes")
    print(f"server thread: {server / scrapes:.0f} µs CPU per scrape; sampling thread: {sampler / ticks:.0f} µs CPU per tick "
          f"(~{ticks:.0f} ticks)")


if __name__ == "__main__":
    main()
