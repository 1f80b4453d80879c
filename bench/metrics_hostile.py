"""The metrics endpoint against a hostile trainer and hostile clients (BENCHMARKS.md, "The
metrics endpoint against hostile timelines and clients"; docs/metrics.md, "Hostile clients").

`modes`: `trainprof agent --metrics-listen` over the fake NVML while 32 open timelines grow by
250 KB a second in all of step events, each with a mode name never seen before, huge and
negative step numbers and times among them; scraped once a second. Prints the agent's RSS and
the scrape's size each second, and the last scrape's left-out counters.

`connections`: 2,000 idle keep-alive connections (one request each, the answer left unread) (or as many as the file limit allows) and 20 that send
an endless header, a line every 100 ms, held open; then a scrape on a new connection, timed.

    python3 bench/metrics_hostile.py TRAINPROF_BIN modes [DURATION_S]
    python3 bench/metrics_hostile.py TRAINPROF_BIN connections [IDLE] [ENDLESS]
"""

import fcntl
import http.client
import pathlib
import resource
import socket
import subprocess
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "agent"))
from metrics_support import Agent  # noqa: E402

HOSTILE_STEPS = ["-5", "99999999999999999999999", "NaN", "1e308", "7"]
HOSTILE_TIMES = ["1e300", "-1e18", "NaN", "0"]


def scrape(port, timeout=30):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        c.request("GET", "/metrics")
        r = c.getresponse()
        return r.status, r.read()
    finally:
        c.close()


def modes(agent, work, duration):
    fw = agent.root / "framework"
    fw.mkdir(parents=True, exist_ok=True)
    base = int(time.time() * 1e6)
    files = []
    for r in range(32):
        f = open(fw / f"{r}-algo-1_pythontimeline.json.{100 + r}-1.tmp", "w")
        f.write('[\n{"name": "process_name", "ph": "M", "pid": 0, "args": {"start_time_since_epoch_in_micros": %d}}' % base)
        f.flush()
        fcntl.flock(f, fcntl.LOCK_EX)
        files.append(f)
    k = 0
    t0 = time.time()
    per_tick = 250_000 // 10 // len(files)
    next_scrape = t0 + 1
    print("s  rss_MiB  scrape_bytes")
    while time.time() - t0 < duration:
        for f in files:
            chunk = []
            n = 0
            while n < per_tick:
                k += 1
                ts = int((time.time() - t0) * 1e6) if k % 7 else HOSTILE_TIMES[k // 7 % len(HOSTILE_TIMES)]
                step = k if k % 5 else HOSTILE_STEPS[k // 5 % len(HOSTILE_STEPS)]
                line = (',\n{"name": "Step:ModeKeys.M%d_%s", "pid": 2, "ph": "X", "ts": %s, "dur": 1000, '
                        '"args": {"pid": 7, "step_num": "%s"}}' % (k, "x" * (k % 300), ts, step))
                chunk.append(line)
                n += len(line)
            f.write("".join(chunk))
            f.flush()
        time.sleep(0.1)
        if time.time() >= next_scrape:
            next_scrape += 1
            status, body = scrape(agent.port)
            print(f"{time.time() - t0:4.0f} {agent.rss_bytes() / 2**20:8.1f} {len(body):12d}", flush=True)
    status, body = scrape(agent.port)
    for line in body.decode().splitlines():
        if "left_out" in line and not line.startswith("#"):
            print(line)
    for f in files:
        f.close()


def connections(agent, idle, endless):
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, idle + endless + 500), hard))
    want = min(idle, min(hard, idle + endless + 500) - endless - 100)
    held = []
    for _ in range(want):
        s = socket.create_connection(("127.0.0.1", agent.port), timeout=5)
        # Idle after one request, kept alive (the answer is left unread).
        s.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
        held.append(s)
    slow = []
    for _ in range(endless):
        s = socket.create_connection(("127.0.0.1", agent.port), timeout=5)
        s.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n")
        slow.append(s)
    t_end = time.time() + 3
    while time.time() < t_end:
        for s in slow:
            try:
                s.send(b"X-A: b\r\n")
            except OSError:
                pass
        time.sleep(0.1)
    t0 = time.time()
    try:
        status, body = scrape(agent.port, timeout=120)
        print(f"{len(held)} idle, {len(slow)} endless headers held: scrape {status}, {len(body)} bytes, "
              f"answered in {time.time() - t0:.3f} s")
    except OSError as e:
        print(f"{len(held)} idle, {len(slow)} endless headers held: no answer after {time.time() - t0:.1f} s ({e})")
    for s in held + slow:
        s.close()


def main():
    trainprof = pathlib.Path(sys.argv[1]).resolve()
    what = sys.argv[2]
    work = pathlib.Path(tempfile.mkdtemp(prefix="trainprof-bench-hostile-"))
    nvml = work / "libnvidia-ml.so.1"
    subprocess.run(["cc", "-shared", "-fPIC", "-O2", "-o", str(nvml), str(ROOT / "agent/tests/c/fake_nvml.c")], check=True)
    agent = Agent(trainprof, nvml, work / "profiler", interval_ms=100)
    try:
        agent.wait_for_tick()
        if what == "modes":
            modes(agent, work, float(sys.argv[3]) if len(sys.argv) > 3 else 20)
        else:
            connections(agent, int(sys.argv[3]) if len(sys.argv) > 3 else 2000, int(sys.argv[4]) if len(sys.argv) > 4 else 20)
    finally:
        agent.stop()


if __name__ == "__main__":
    main()
