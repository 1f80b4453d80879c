"""Benchmark (not a test): what one sampling tick costs, the trainprof agent (release build)
against a psutil collector of the same metrics, side by side in one run.

    scripts/bench-agent              # builds the release agent, runs this with .venv
    scripts/bench-agent 60           # 60 s per collector (or BENCH_SECONDS=60)

Both collectors sample every BENCH_INTERVAL_MS (100) and write the same JSON lines
(docs/formats.md, the system file) into their own temporary folder, one write per tick:

  system  `trainprof agent`, against this file run as `--collect`: psutil
          cpu_times_percent(percpu=True) (busy and iowait per core, total = their mean),
          virtual_memory(), disk_io_counters(perdisk=True) summed over the whole disks of
          /sys/block (as the agent: not devices/virtual), net_io_counters(pernic=True) less
          lo, the cgroup files the agent keeps open (found in /proc/<agent>/fd; psutil has no
          cgroup API, so they are read with open().read() and parsed in Python), and its own
          CPU time and RSS every 10 s (psutil.Process().cpu_times(), memory_info()).
  tree    the same plus a process tree of BENCH_TREE_SLEEPS `sleep`s under `sh`:
          `trainprof run -- sh -c 'sleep & ... wait'`, against the collector starting the
          same command and reading psutil.Process(pid).children(recursive=True) and each
          process's cpu_times() and memory_info() every tick (Process objects cached by pid).

  floor   (system only) bench/c/floor.c, built with cc by scripts/bench-agent: the files the
          agent kept open (its /proc/<pid>/fd under /proc and /sys, taken in the first
          `trainprof agent` run), each re-read from offset 0 with pread at every deadline,
          and one write(2) per tick of the agent's bytes per tick. No parsing: the least any
          collector of the same figures pays. Printed as agent / floor.

  before  (system only, when BENCH_AGENT_BEFORE names another `trainprof` binary, e.g. one
          built from the main branch) `trainprof agent` of that binary, measured the same way
          in the same rounds: a change's effect side by side with the floor. Printed as
          before / floor and before / agent.

The collectors run one after the other, never together (BENCH_ROUNDS rounds, the order
alternating between rounds), so on a small machine neither takes CPU from the other.

Measured from outside, the same way for both, start-up excluded: once the first tick is in
the collector's file, the harness reads the process's CPU time (the sum of
/proc/<pid>/task/*/schedstat, ns; /proc/<pid>/stat utime+stime, in clock ticks, is shown
beside it but is too coarse for a few ms) and counts the distinct Timestamps written; after
BENCH_SECONDS it reads both again, and VmRSS / VmHWM from /proc/<pid>/status, then sends
SIGTERM. CPU per tick = CPU between the readings / ticks written between them. The agent's
own summary line (which does include its start-up) is shown as printed.
"""

import glob
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time

from proc_cpu import cpu_ns  # bench/proc_cpu.py

GOAL_US_PER_TICK = 50.0
GOAL_RATIO = 6.0
GOAL_FLOOR_RATIO = 1.15
GOAL_CORE_PERCENT = 0.5
GOAL_RSS_MIB = 10.0

STOP_WAIT_S = 5.0
notes = []  # what went wrong on the way, printed under the table

TS_RE = re.compile(rb'"Timestamp":([0-9.]+)\}')


# --------------------------------------------------------------------------------------
# The psutil collector (runs in its own process: `agent_vs_psutil.py --collect ...`)


def read_cgroup(path):
    """One cgroup file (opened, read, closed, as a Python collector would)."""
    with open(path, "rb") as f:
        return f.read()


def parse_cgroup(paths):
    """The figures the agent takes from the same files: I/O counters, memory, CPU."""
    io_ops = io_read = io_write = 0
    mem = {}
    cpu = {}
    for path in paths:
        text = read_cgroup(path)
        name = os.path.basename(path)
        if name == "blkio.throttle.io_serviced":
            for line in text.splitlines():
                f = line.split()
                if len(f) == 3 and f[1] in (b"Read", b"Write"):
                    io_ops += int(f[2])
        elif name == "blkio.throttle.io_service_bytes":
            for line in text.splitlines():
                f = line.split()
                if len(f) == 3 and f[1] == b"Read":
                    io_read += int(f[2])
                elif len(f) == 3 and f[1] == b"Write":
                    io_write += int(f[2])
        elif name == "io.stat":
            for line in text.splitlines():
                for kv in line.split()[1:]:
                    k, _, v = kv.partition(b"=")
                    if k in (b"rios", b"wios"):
                        io_ops += int(v)
                    elif k == b"rbytes":
                        io_read += int(v)
                    elif k == b"wbytes":
                        io_write += int(v)
        elif name == "memory.stat":
            for line in text.splitlines():
                k, _, v = line.partition(b" ")
                if k in (b"inactive_file", b"total_inactive_file"):
                    mem["inactive"] = int(v)
        elif name in ("memory.current", "memory.usage_in_bytes"):
            mem["usage"] = int(text)
        elif name in ("memory.max", "memory.limit_in_bytes"):
            mem["limit"] = None if text.strip() == b"max" else int(text)
        elif name == "cpu.stat":
            for line in text.splitlines():
                k, _, v = line.partition(b" ")
                cpu[k.decode()] = int(v)
        elif name in ("cpu.max", "cpu.cfs_quota_us", "cpu.cfs_period_us", "cpuacct.usage"):
            cpu[name] = text.split()
    return (io_ops, io_read, io_write), mem, cpu


def whole_disks():
    out = []
    for name in os.listdir("/sys/block"):
        if "devices/virtual/" not in os.readlink(os.path.join("/sys/block", name)):
            out.append(name.replace("!", "/"))
    return set(out)


def collect(out_path, interval_s, cgroup_files, tree_cmd):
    import psutil

    stop = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
    disks = whole_disks()
    me = psutil.Process()
    node = "algo-1"
    tree_root = subprocess.Popen(tree_cmd) if tree_cmd else None
    procs = {}

    def disk_totals():
        c = psutil.disk_io_counters(perdisk=True)
        ops = rb = wb = 0
        for name, d in c.items():
            if name in disks:
                ops += d.read_count + d.write_count
                rb += d.read_bytes
                wb += d.write_bytes
        return ops, rb, wb

    def net_totals():
        rx = tx = 0
        for name, n in psutil.net_io_counters(pernic=True).items():
            if name != "lo":
                rx += n.bytes_recv
                tx += n.bytes_sent
        return rx, tx

    def tree_reading():
        try:
            root = procs.get(tree_root.pid) or psutil.Process(tree_root.pid)
            members = [root] + root.children(recursive=True)
        except psutil.NoSuchProcess:
            return 0.0, 0, 0
        cpu_s, rss, alive = 0.0, 0, {}
        for p in members:
            p = procs.get(p.pid, p)
            try:
                with p.oneshot():
                    t = p.cpu_times()
                    rss += p.memory_info().rss
                cpu_s += t.user + t.system
                alive[p.pid] = p
            except psutil.NoSuchProcess:
                pass
        procs.clear()
        procs.update(alive)
        return cpu_s, rss, len(alive)

    # The first readings (rates need two), like the agent's probe.
    psutil.cpu_times_percent(percpu=True)
    prev_disk, prev_net = disk_totals(), net_totals()
    prev_cg = parse_cgroup(cgroup_files)[0] if cgroup_files else None
    prev_tree = tree_reading() if tree_root else None
    prev_self = sum(me.cpu_times()[:2])
    prev_at = self_at = time.monotonic()
    self_ticks = 0

    out = open(out_path, "w")
    start = time.monotonic()
    k = 1
    while not stop:
        delay = start + k * interval_s - time.monotonic()
        if delay > 0:
            time.sleep(delay)
        if stop:
            break
        now = time.monotonic()
        ts = round(time.time(), 6)
        dt = now - prev_at
        lines = []

        def add(kind, name, dim, value):
            lines.append(json.dumps({"Type": kind, "Name": name, "Dimension": dim, "Value": round(value, 2),
                                     "NodeId": node, "Timestamp": ts}, separators=(",", ":")))

        cores = psutil.cpu_times_percent(percpu=True)
        busy = [100.0 - c.idle - c.iowait for c in cores]
        iow = [c.iowait for c in cores]
        add("host", "AllCores", "BusyPercent", sum(busy) / len(busy))
        add("host", "AllCores", "IOWaitPercent", sum(iow) / len(iow))
        for i in range(len(cores)):
            add("cpu", "cpu%d" % i, "CPUUtilization", busy[i])
            add("cpu", "cpu%d" % i, "I/OWaitPercentage", iow[i])

        vm = psutil.virtual_memory()
        (_, cg_mem, _) = cg = parse_cgroup(cgroup_files) if cgroup_files else (None, {}, {})
        if cg_mem.get("usage") is not None and cg_mem.get("limit"):
            used, limit, basis = cg_mem["usage"] - cg_mem.get("inactive", 0), min(cg_mem["limit"], vm.total), "cgroup"
        else:
            used, limit, basis = vm.total - vm.available, vm.total, "host"
        add("memory", "MemoryUsedPercent", "", 100.0 * used / limit)
        add("ram", "MemoryUsedBytes", basis, used)
        add("ram", "MemoryLimitBytes", basis, limit)

        d = disk_totals()
        add("i/o", "IOPS", "", (d[0] - prev_disk[0]) / dt)
        add("i/o", "ReadThroughputInBytesPerSecond", "", (d[1] - prev_disk[1]) / dt)
        add("i/o", "WriteThroughputInBytesPerSecond", "", (d[2] - prev_disk[2]) / dt)
        n = net_totals()
        add("network", "ReceiveBytesPerSecond", "Algorithm", (n[0] - prev_net[0]) / dt)
        add("network", "TransmitBytesPerSecond", "Algorithm", (n[1] - prev_net[1]) / dt)
        if prev_cg is not None:
            io = cg[0]
            add("container", "IOPS", "cgroup", (io[0] - prev_cg[0]) / dt)
            add("container", "ReadThroughputInBytesPerSecond", "cgroup", (io[1] - prev_cg[1]) / dt)
            add("container", "WriteThroughputInBytesPerSecond", "cgroup", (io[2] - prev_cg[2]) / dt)
            prev_cg = io
        if tree_root:
            t = tree_reading()
            if t[2]:
                add("trainer", "CPUPercent", "ProcessTree", max(0.0, t[0] - prev_tree[0]) / dt * 100.0)
                add("trainer", "RSSBytes", "ProcessTree", t[1])
                add("trainer", "Processes", "ProcessTree", t[2])
            prev_tree = t
        self_ticks += 1
        if now - self_at >= 10.0:
            c = sum(me.cpu_times()[:2])
            add("agent", "CPUPercent", "Self", (c - prev_self) / (now - self_at) * 100.0)
            add("agent", "CPUMicrosPerTick", "Self", (c - prev_self) * 1e6 / self_ticks)
            add("agent", "RSSBytes", "Self", me.memory_info().rss)
            prev_self, self_at, self_ticks = c, now, 0
        prev_disk, prev_net, prev_at = d, n, now

        out.write("\n".join(lines) + "\n")
        out.flush()  # one write per tick, like the agent
        # The next deadline after this tick; deadlines already passed are skipped.
        k = max(k + 1, int((time.monotonic() - start) / interval_s) + 1)
    out.close()
    if tree_root:
        tree_root.terminate()
        tree_root.wait()


# --------------------------------------------------------------------------------------
# The harness


def stat_ticks(pid):
    with open("/proc/%d/stat" % pid, "rb") as f:
        rest = f.read().rsplit(b")", 1)[1].split()
    return int(rest[11]) + int(rest[12])


def status_kib(pid, key):
    with open("/proc/%d/status" % pid) as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1])
    return 0


def status_text(pid, key):
    try:
        with open("/proc/%d/status" % pid) as f:
            for line in f:
                if line.startswith(key + ":"):
                    return line.split(None, 1)[1].strip()
    except OSError:
        pass
    return ""


def signal_names(mask_hex):
    mask = int(mask_hex or "0", 16)
    names = []
    for n in range(1, 65):
        if mask >> (n - 1) & 1:
            try:
                names.append(signal.Signals(n).name)
            except ValueError:
                names.append(str(n))
    return "+".join(names) or "none"


def timestamps(root):
    """The distinct Timestamps of every complete line in the JSON-lines files under root."""
    seen = set()
    paths = [os.path.join(d, f) for d, _, files in os.walk(root) for f in files if not f.endswith(".ts")]
    for path in paths:
        try:
            with open(path, "rb") as f:
                data = f.read()
        except OSError:  # sealed (renamed) meanwhile; it is found under its new name next time
            continue
        seen.update(TS_RE.findall(data[: data.rfind(b"\n") + 1]))
    return seen


def bytes_per_tick(root):
    """The bytes the collector under root wrote per tick (every file, markers aside)."""
    size = 0
    for d, _, files in os.walk(root):
        for f in files:
            if not f.endswith(".ts"):
                try:
                    size += os.path.getsize(os.path.join(d, f))
                except OSError:
                    pass
    return max(64, size // max(1, len(timestamps(root))))


def descendants(pid):
    pairs = []
    for path in glob.glob("/proc/[0-9]*/stat"):
        try:
            with open(path, "rb") as f:
                rest = f.read().rsplit(b")", 1)[1].split()
            pairs.append((int(path.split("/")[2]), int(rest[1])))
        except (OSError, IndexError, ValueError):
            pass
    tree, i = [pid], 0
    while i < len(tree):
        tree += [p for p, pp in pairs if pp == tree[i] and p not in tree]
        i += 1
    return tree[1:]


def measure(label, argv, files_root, seconds, interval_ms, log_path):
    """Runs argv, measures between its first tick and `seconds` later, stops it."""
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=log)
    tree, blocked = [], {}
    try:
        deadline = time.monotonic() + 30
        while not timestamps(files_root):
            if proc.poll() is not None or time.monotonic() > deadline:
                sys.exit("%s: no tick written (exit %s); log %s:\n%s"
                         % (label, proc.returncode, log_path, open(log_path).read()))
            time.sleep(0.005)
        t0, c0, s0, n0 = time.monotonic(), cpu_ns(proc.pid), stat_ticks(proc.pid), len(timestamps(files_root))
        fds = []
        for fd in glob.glob("/proc/%d/fd/*" % proc.pid):
            try:
                fds.append(os.readlink(fd))
            except OSError:
                pass
        time.sleep(max(0.0, t0 + seconds - time.monotonic()))
        c1, s1, t1 = cpu_ns(proc.pid), stat_ticks(proc.pid), time.monotonic()
        n1 = len(timestamps(files_root))
        rss, hwm = status_kib(proc.pid, "VmRSS"), status_kib(proc.pid, "VmHWM")
        tree = descendants(proc.pid)
        blocked = {pid: signal_names(status_text(pid, "SigBlk")) for pid in tree}
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=STOP_WAIT_S)
        except subprocess.TimeoutExpired:
            # `trainprof run` passes SIGTERM on to the command and stops when it exits: a
            # command that does not exit is killed here, so that the summary still comes.
            stuck = [pid for pid in tree if status_text(pid, "State")]
            notes.append("%s: still running %.0f s after SIGTERM; its tree %s (signals blocked in it: %s) was killed"
                         % (label, STOP_WAIT_S, stuck, ", ".join(sorted(set(blocked.values())))))
            for pid in stuck:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
    for pid in tree:  # sleeps left behind by the tree command
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    with open(log_path, errors="replace") as f:
        log_text = f.read()
    return {
        "label": label, "cpu_ns": c1 - c0, "stat_ticks": s1 - s0, "wall_s": t1 - t0, "ticks": n1 - n0,
        "expected_ticks": (t1 - t0) * 1000.0 / interval_ms, "rss_kib": rss, "hwm_kib": hwm,
        "fds": fds, "exit": proc.returncode, "log": log_text, "pid": proc.pid,
    }


def combine(runs):
    r = dict(runs[0])
    for k in ("cpu_ns", "stat_ticks", "wall_s", "ticks", "expected_ticks"):
        r[k] = sum(x[k] for x in runs)
    r["rss_kib"] = max(x["rss_kib"] for x in runs)
    r["hwm_kib"] = max(x["hwm_kib"] for x in runs)
    r["logs"] = [x["log"] for x in runs]
    return r


def us_per_tick(r):
    return r["cpu_ns"] / 1e3 / max(1, r["ticks"])


def core_percent(r):
    return r["cpu_ns"] / 1e9 / r["wall_s"] * 100.0


def main():
    seconds = float(sys.argv[1]) if len(sys.argv) > 1 else float(os.environ.get("BENCH_SECONDS", "20"))
    interval_ms = int(os.environ.get("BENCH_INTERVAL_MS", "100"))
    rounds = int(os.environ.get("BENCH_ROUNDS", "1"))
    with_tree = os.environ.get("BENCH_TREE", "1") != "0"
    sleeps = int(os.environ.get("BENCH_TREE_SLEEPS", "3"))
    binary = os.environ.get("TRAINPROF_BIN", "target/release/trainprof")
    cmdline = os.environ.get("BENCH_CMDLINE", " ".join(sys.argv))
    hz = os.sysconf("SC_CLK_TCK")
    import psutil

    tmp = tempfile.mkdtemp(prefix="trainprof-agentbench-")
    me = os.path.abspath(__file__)
    tree_cmd = ["sh", "-c", " ".join(["sleep %d &" % int(seconds + 60)] * sleeps) + " wait"]
    for key in ("SMPROFILER_CONFIG_PATH", "TRAINPROF_LOCAL_PATH", "TRAINPROF_DISABLE"):
        os.environ.pop(key, None)
    os.environ["SMPROFILER_CONFIG_PATH"] = os.path.join(tmp, "absent-config.json")  # built-in defaults

    print("== %s, %d CPUs, load average %s, %s s per collector at %d ms, %d round(s), sequential "
          "(never two collectors at once; order alternates between rounds)"
          % (" ".join(os.uname()[i] for i in (0, 2, 4)), os.cpu_count(), " ".join(open("/proc/loadavg").read().split()[:3]),
             ("%g" % seconds), interval_ms, rounds))
    results = {}
    cgroup_files = []

    def run(key, label, argv, root):
        n = sum(1 for k in results if k[0] == key)
        r = measure(label, argv, root, seconds, interval_ms, os.path.join(tmp, "%s-%d.log" % (key, n)))
        results[(key, n)] = r
        return r

    floor_bin = os.environ.get("BENCH_FLOOR_BIN")
    if not floor_bin:
        notes.append("no BENCH_FLOOR_BIN: the floor was not run (scripts/bench-agent builds it)")
    floor_files, floor_bytes = [], 0
    before_bin = os.environ.get("BENCH_AGENT_BEFORE")

    for rnd in range(rounds):
        agent_first = rnd % 2 == 0
        for variant in (["system", "tree"] if with_tree else ["system"]):
            steps = ["agent", "psutil"] if agent_first else ["psutil", "agent"]
            if not cgroup_files:
                steps = ["agent", "psutil"]  # the psutil collector reads the files the agent found
            if variant == "system" and floor_bin:
                # The floor reads the files the first agent run kept open: after it.
                steps.insert(1, "floor")
            if variant == "system" and before_bin:
                # Next to the agent, on the side away from the floor in alternate rounds.
                steps.insert(steps.index("agent") + (1 if agent_first else 0), "before")
            for who in steps:
                out = os.path.join(tmp, "%s-%s-%d" % (who, variant, rnd))
                if who == "agent":
                    argv = [binary] + (["agent"] if variant == "system" else ["run"]) + [
                        "--interval-ms", str(interval_ms), "--local-path", out]
                    if variant == "tree":
                        argv += ["--"] + tree_cmd
                    r = run("agent-" + variant, "trainprof " + ("agent" if variant == "system" else "run"), argv, out)
                    if variant == "system" and not cgroup_files:
                        cgroup_files = sorted({p for p in r["fds"] if p.startswith("/sys/fs/cgroup/")})
                    if variant == "system" and not floor_files:
                        # The agent's own /proc/<pid>/… (net/dev) is gone with it: the floor
                        # reads its own /proc/self/… (the same network namespace).
                        own = "/proc/%d/" % r["pid"]
                        floor_files = sorted({"/proc/self/" + p[len(own):] if p.startswith(own) else p
                                              for p in r["fds"] if p.startswith(("/proc/", "/sys/"))})
                        floor_bytes = bytes_per_tick(out)
                elif who == "before":
                    argv = [before_bin, "agent", "--interval-ms", str(interval_ms), "--local-path", out]
                    run("before-system", "agent (before)", argv, out)
                elif who == "floor":
                    os.makedirs(out)
                    argv = [floor_bin, os.path.join(out, "floor.json"), str(interval_ms), str(floor_bytes)]
                    run("floor-system", "floor (C)", argv + floor_files, out)
                else:
                    os.makedirs(out)
                    argv = [sys.executable, me, "--collect", os.path.join(out, "psutil.json"),
                            str(interval_ms), json.dumps(cgroup_files)]
                    if variant == "tree":
                        argv += tree_cmd
                    run("psutil-" + variant, "psutil " + psutil.__version__, argv, out)

    def get(key):
        return combine([r for k, r in sorted(results.items()) if k[0] == key])

    floor = get("floor-system") if floor_bin else None
    before = get("before-system") if before_bin else None
    if floor:
        for log in floor["logs"]:
            notes.extend("floor: " + l for l in log.splitlines() if "cannot open" in l)
    rows = [("system", get("agent-system"), get("psutil-system"))]
    if with_tree:
        rows.append(("tree", get("agent-tree"), get("psutil-tree")))

    print()
    print("%-7s %-16s %6s %12s %10s %12s %9s %9s" % ("metrics", "collector", "ticks", "CPU µs/tick", "(stat)",
                                                     "% one core", "VmRSS MiB", "VmHWM MiB"))

    def row(variant, r):
        stat_us = r["stat_ticks"] * 1e6 / hz / max(1, r["ticks"])
        print("%-7s %-16s %6d %12.1f %10.0f %12.3f %9.1f %9.1f" % (
            variant, r["label"], r["ticks"], us_per_tick(r), stat_us, core_percent(r),
            r["rss_kib"] / 1024, r["hwm_kib"] / 1024))

    for variant, a, p in rows:
        for r in (a, p):
            row(variant, r)
        print("%-7s %-16s %6s %11.1f×" % (variant, "psutil / agent", "", us_per_tick(p) / us_per_tick(a)))
        if variant == "system" and floor:
            row(variant, floor)
            print("%-7s %-16s %6s %11.2f×" % (variant, "agent / floor", "", us_per_tick(a) / us_per_tick(floor)))
        if variant == "system" and before:
            row(variant, before)
            if floor:
                print("%-7s %-16s %6s %11.2f×" % (variant, "before / floor", "", us_per_tick(before) / us_per_tick(floor)))
            print("%-7s %-16s %6s %11.2f×" % (variant, "before / agent", "", us_per_tick(before) / us_per_tick(a)))
    print("(ticks: distinct Timestamps written between the readings; expected from the elapsed time: %s. "
          "(stat): the same from /proc/<pid>/stat utime+stime, %d Hz ticks, too coarse at this size.)"
          % (", ".join("%.0f" % r["expected_ticks"] for _, a, p in rows for r in (a, p)), hz))
    if before:
        print("before: %s" % before_bin)

    for variant, a, p in rows:  # for bench/run.py (scripts/bench)
        what = "system metrics" if variant == "system" else "system metrics + process tree"
        for metric, unit, mine, theirs in (
            ("agent CPU per tick, %s" % what, "µs/tick", us_per_tick(a), us_per_tick(p)),
            ("agent peak RSS, %s" % what, "MiB", a["hwm_kib"] / 1024, p["hwm_kib"] / 1024),
        ):
            print("RESULT " + json.dumps({"metric": metric, "unit": unit, "trainprof": round(mine, 1),
                                          "peer": round(theirs, 1), "peer_name": p["label"] + " collector",
                                          "better": "lower"}))

    a, p = rows[0][1], rows[0][2]
    gpu = "GPU" if any("GPUs)" in l and " 0 GPUs)" not in l for l in a["logs"]) else "no GPU"
    print()
    print("agent's own summary (%s; includes its start-up):" % ", ".join(
        "trainprof %s" % ("agent" if v == "system" else "run") for v, _, _ in rows))
    for _, r, _ in rows:
        for log in r["logs"]:
            for line in log.splitlines():
                if line.startswith(("trainprof: ticks:", "trainprof: agent:", "trainprof: sampling every")):
                    print("  " + line)
    print("cgroup files read by both: %s" % (", ".join(cgroup_files) or "none"))
    if floor:
        print("floor: %d files the agent keeps open, %d bytes per tick: %s"
              % (len(floor_files), floor_bytes, ", ".join(floor_files)))
    print()
    ratio = us_per_tick(p) / us_per_tick(a)
    goals = [
        ("agent / floor CPU per tick", "<= %.2f×" % GOAL_FLOOR_RATIO,
         "%.2f×" % (us_per_tick(a) / us_per_tick(floor)) if floor else "not run",
         bool(floor) and us_per_tick(a) / us_per_tick(floor) <= GOAL_FLOOR_RATIO),
        ("agent CPU per tick (%s)" % gpu, "<= %.0f µs" % GOAL_US_PER_TICK, "%.1f µs" % us_per_tick(a),
         us_per_tick(a) <= GOAL_US_PER_TICK),
        ("psutil / agent CPU per tick", ">= %.0f×" % GOAL_RATIO, "%.1f×" % ratio, ratio >= GOAL_RATIO),
        ("agent share of one core at %d ms" % interval_ms, "<= %.1f %%" % GOAL_CORE_PERCENT,
         "%.3f %%" % core_percent(a), core_percent(a) <= GOAL_CORE_PERCENT),
        ("agent RSS (peak VmHWM)", "<= %.0f MiB" % GOAL_RSS_MIB, "%.1f MiB" % (a["hwm_kib"] / 1024),
         a["hwm_kib"] / 1024 <= GOAL_RSS_MIB),
    ]
    print("%-36s %-10s %-10s %s" % ("goal (issue)", "target", "measured", ""))
    for name, target, got, ok in goals:
        print("%-36s %-10s %-10s %s" % (name, target, got, "met" if ok else "NOT MET"))
    for note in notes:
        print("note: " + note)
    print()
    print("command: %s" % cmdline)
    import shutil

    shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--collect":
        collect(sys.argv[2], int(sys.argv[3]) / 1000.0, json.loads(sys.argv[4]), sys.argv[5:])
    else:
        main()
