"""The agent's stall watcher under planted dump folders (docs/on-disk.md, "Host state at a
stall"): starts `trainprof agent` on a fresh LocalPath, then (as a trainer's user could while
it runs) plants N well-named folders `framework/hangs/0-algo-1/<i>-<now µs>/`, each with an
empty `stall.json` (not the hook's record), and reports the agent's CPU over the seconds after
the planting (utime + stime from /proc/<pid>/stat, % of one core) and the host records it
wrote under `system/hangs/`, beside the same agent's CPU over as many seconds before the planting
(a `RESULT {json}` line for bench/run.py). (Planted before the start, the agent's one walk of the whole
output folder at its start would be measured too.)

    python3 bench/hang_scan.py --bin target/release/trainprof --folders 200000 --seconds 15

Standard library only."""

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time


def cpu_s(pid):
    """utime + stime of the process (all its threads), seconds."""
    with open("/proc/%d/stat" % pid) as f:
        rest = f.read().rsplit(")", 1)[1].split()
    return (int(rest[11]) + int(rest[12])) / os.sysconf("SC_CLK_TCK")


def tree_bytes(path):
    total = 0
    for root, _, files in os.walk(path):
        for name in files:
            try:
                total += os.lstat(os.path.join(root, name)).st_size
            except OSError:
                pass
    return total


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", default=os.environ.get("TRAINPROF_BIN", "target/release/trainprof"))
    ap.add_argument("--folders", type=int, default=int(os.environ.get("BENCH_FOLDERS", "50000")))
    ap.add_argument("--seconds", type=float, default=float(os.environ.get("BENCH_SECONDS", "15")))
    ap.add_argument("--warmup", type=float, default=3.0)
    args = ap.parse_args()
    top = tempfile.mkdtemp(prefix="hang-scan-")
    try:
        local = os.path.join(top, "out")
        node = os.path.join(local, "framework", "hangs", "0-algo-1")
        os.makedirs(node)
        env = dict(os.environ)
        # No config: the defaults, with the folder given.
        env.pop("SMPROFILER_CONFIG_PATH", None)
        log = open(os.path.join(top, "agent.log"), "wb")
        p = subprocess.Popen([args.bin, "agent", "--local-path", local], env=env, stdout=log, stderr=log)
        try:
            # The peer: the same agent over the same number of seconds with nothing planted,
            # after its first second (its start-up walk).
            time.sleep(1.0)
            c_idle, w_idle = cpu_s(p.pid), time.time()
            time.sleep(max(args.warmup - 1.0, args.seconds))
            idle = 100 * (cpu_s(p.pid) - c_idle) / max(time.time() - w_idle, 1e-9)
            c_start, w_start = cpu_s(p.pid), time.time()
            now_us = int(time.time() * 1e6)
            for i in range(args.folders):
                d = os.path.join(node, "%d-%d" % (i, now_us + i))
                os.mkdir(d)
                open(os.path.join(d, "stall.json"), "wb").close()
            c0, w0 = cpu_s(p.pid), time.time()
            time.sleep(args.seconds)
            c1, w1 = cpu_s(p.pid), time.time()
        finally:
            p.send_signal(signal.SIGTERM)
            try:
                p.wait(timeout=60)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        planting = "while planting (%.1f s) %.2f %%" % (w0 - w_start, 100 * (c0 - c_start) / max(w0 - w_start, 1e-9))
        records = os.path.join(local, "system", "hangs")
        n = sum(len(fs) for _, _, fs in os.walk(records))
        print(
            "folders %d: agent CPU (%% of a core) %s, over the %.1f s after %.2f %%; "
            "%d host records, %d bytes"
            % (args.folders, planting, w1 - w0, 100 * (c1 - c0) / (w1 - w0), n, tree_bytes(records))
        )
        print("RESULT " + json.dumps({"metric": "agent CPU over %.0f s after %d dump folders were planted" % (w1 - w0, args.folders),
                                      "unit": "% of a core", "trainprof": round(100 * (c1 - c0) / (w1 - w0), 3),
                                      "peer": round(idle, 3), "peer_name": "the same agent, nothing planted",
                                      "better": "lower"}))
    finally:
        shutil.rmtree(top, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
