"""Write a synthetic profiled job in trainprof's on-disk formats (docs/formats.md).

    python bench/synth_job.py OUT [--minutes 60] [--ranks 8] [--gpus 8] [--cores 8] [--interval 0.1]

One node (`algo-1`) with GPUs and cores, system metrics every `--interval` seconds, and one
timeline per rank (`<rank>-algo-1`): every step (`Step:ModeKeys.TRAIN`) with a dataloader event,
and every 5 minutes a detailed window of 10 steps with `Forward`, its submodules, CPU ops and
GPU kernels. Rank 5 is 10 % slower, and one step in 1000 takes 10× as long. What this writes
is what the agent and the hook write: the same names, line formats, spacing, rotation (a
timeline file a minute, a system file a minute, the last tick in a file of its own) and end
markers, so smdebug 1.0.34's readers read it (`bench/report_vs_smdebug.py` runs them on it).

Deterministic for a given seed. Used by the report benchmark; not a test fixture.
"""

import argparse
import json
import os
import random
import time

START_S = 1795312800  # a whole hour, UTC
STEP_PHASE = "Step:ModeKeys.TRAIN"
LOADER = "_MultiProcessingDataLoaderIter.DataLoaderIter::GetNext"


def num(v):
    """A system line's number: shortest form, no exponent, no '.0' on whole numbers."""
    if v == int(v):
        return str(int(v))
    return repr(v)


def hour_folder(t_s):
    return time.strftime("%Y%m%d%H", time.gmtime(t_s))


def write_system(root, args, rng):
    """One line per metric per tick, one file a minute named by its first tick's second."""
    node = "algo-1"
    ticks = int(args.minutes * 60 / args.interval)
    base = os.path.join(root, "system", "incremental")
    out, name_s, lines = None, None, 0
    gpu_mem = [30.0 + g for g in range(args.gpus)]
    used_names = set()

    def open_file(second):
        s = second
        while s in used_names:
            s -= 1
        used_names.add(s)
        d = os.path.join(base, hour_folder(s))
        os.makedirs(d, exist_ok=True)
        return open(os.path.join(d, "%010d.%s.json" % (s, node)), "x")

    for k in range(ticks):
        t = round(START_S + k * args.interval, 6)
        second = int(t)
        last = k == ticks - 1
        if out is None or last or second // 60 != name_s // 60:
            if out is not None:
                out.close()
            out = open_file(second)
            name_s = second
        ts = num(t)
        buf = []

        def line(typ, name, dim, value):
            buf.append('{"Type":"%s","Name":"%s","Dimension":"%s","Value":%s,"NodeId":"%s","Timestamp":%s}\n'
                       % (typ, name, dim, num(round(value, 2)), node, ts))

        busy = []
        for c in range(args.cores):
            v = min(100.0, max(0.0, rng.gauss(55 + 3 * (c % 5), 15)))
            busy.append(v)
            line("cpu", "cpu%d" % c, "CPUUtilization", v)
            line("cpu", "cpu%d" % c, "I/OWaitPercentage", rng.random() * 2)
        line("host", "AllCores", "BusyPercent", sum(busy) / len(busy))
        line("host", "AllCores", "IOWaitPercent", rng.random())
        mem = 40 + 5 * k / ticks
        line("memory", "MemoryUsedPercent", "", mem)
        line("ram", "MemoryUsedBytes", "host", mem / 100 * 1.1e12)
        line("ram", "MemoryLimitBytes", "host", 1.1e12)
        for g in range(args.gpus):
            gpu_mem[g] = min(99.0, gpu_mem[g] + rng.random() * 0.0005)
            line("gpu", "gpu%d" % g, "GPUUtilization", min(100.0, max(0.0, rng.gauss(85, 8))))
            line("gpu", "gpu%d" % g, "GPUMemoryUtilization", gpu_mem[g])
            line("accelerator", "device%d" % g, "MemUsedBytes", gpu_mem[g] / 100 * 80e9)
        line("i/o", "IOPS", "", rng.random() * 3000)
        line("i/o", "ReadThroughputInBytesPerSecond", "", rng.random() * 4e8)
        line("i/o", "WriteThroughputInBytesPerSecond", "", rng.random() * 4e7)
        line("network", "ReceiveBytesPerSecond", "Algorithm", rng.random() * 1e9)
        line("network", "TransmitBytesPerSecond", "Algorithm", rng.random() * 1e9)
        line("trainer", "CPUPercent", "ProcessTree", 400 + rng.random() * 300)
        line("trainer", "RSSBytes", "ProcessTree", 2e10 + k * 1000)
        line("trainer", "Processes", "ProcessTree", 9 + args.ranks)
        out.write("".join(buf))
        lines += len(buf)
    out.close()
    return lines


class Timeline:
    """One rank's writer: phases numbered in first-met order, a file sealed every minute."""

    def __init__(self, root, node, pid, base_us):
        self.root, self.node, self.pid, self.base = root, node, pid, base_us
        self.phases = {}
        self.lines = None
        self.opened_us = None
        self.max_end = 0
        self.last_name = 0
        self.events = 0

    def event(self, phase, name, start_us, dur_us, step, extra=""):
        if self.lines is not None and start_us - self.opened_us >= 60_000_000:
            self.seal()
        if self.lines is None:
            self.lines = [
                '{"name": "process_name", "ph": "M", "pid": 0, "args": {"start_time_since_epoch_in_micros": %d}}'
                % self.base,
                '{"name": "process_sort_index", "ph": "M", "pid": 0, "args": {"sort_index": 0}}',
            ]
            self.opened_us = start_us
            self.in_file = set()
        idx = self.phases.setdefault(phase, len(self.phases) + 1)
        if phase not in self.in_file:
            self.in_file.add(phase)
            self.lines.append('{"name": "process_name", "ph": "M", "pid": %d, "args": {"name": %s}}'
                              % (idx, json.dumps(phase)))
            self.lines.append('{"name": "process_sort_index", "ph": "M", "pid": %d, "args": {"sort_index": %d}}'
                              % (idx, idx))
        self.lines.append('{"name": %s, "pid": %d, "ph": "X", "ts": %d, "dur": %d, "args": {"pid": %d, "step_num": "%d"%s}}'
                          % (json.dumps(name), idx, start_us - self.base, dur_us, self.pid, step, extra))
        self.max_end = max(self.max_end, start_us + dur_us)
        self.events += 1

    def seal(self):
        if self.lines is None:
            return
        t = max(self.max_end, self.last_name + 1)
        self.last_name = t
        d = os.path.join(self.root, "framework", "pevents", hour_folder(t // 1_000_000))
        os.makedirs(d, exist_ok=True)
        with open(os.path.join(d, "%d_%s_pythontimeline.json" % (t, self.node)), "x") as f:
            f.write("[\n" + ",\n".join(self.lines) + "\n]")
        self.lines = None


def write_rank(root, args, rank, rng):
    node = "%d-algo-1" % rank
    pid = 4000 + rank
    start_us = START_S * 1_000_000
    end_us = start_us + int(args.minutes * 60 * 1e6)
    tl = Timeline(root, node, pid, start_us + 2_000_000 + rank * 1000)
    t = start_us + 10_000_000  # initialisation: 10 s
    step = 0
    slow = 1.1 if rank == 5 else 1.0
    while True:
        ms = args.step_ms * slow * (0.9 + 0.2 * rng.random())
        if step % 1000 == 999:
            ms *= 10
        dur = int(ms * 1000)
        if t + dur > end_us - 1_000_000:
            break
        tl.event("DataLoaderIter", LOADER, t, int(dur * 0.05), step + 1)
        if step % 3000 < 10:  # a detailed window of 10 steps every 3000 (5 minutes at 100 ms)
            fwd0, fwd = t + int(dur * 0.06), int(dur * 0.4)
            for layer in range(20):
                tl.event("Forward-SubModuleInternal", "layer%d.conv" % layer, fwd0 + layer * fwd // 20, fwd // 25, step)
            for op in range(args.ops):
                o0 = t + int(dur * 0.06) + op * int(dur * 0.9) // args.ops
                tl.event("cpu_functions", "aten::op_%d" % (op % 40), o0, int(dur * 0.9) // args.ops // 2, step,
                         ', "tid": %d' % (pid * 10))
            for op in range(args.ops):
                k0 = t + int(dur * 0.08) + op * int(dur * 0.9) // args.ops
                tl.event("gpu_functions-dev:%d" % rank, "kernel_%d" % (op % 30), k0, int(dur * 0.9) // args.ops // 3,
                         step, ', "tid": 7, "device": %d, "start_cpu_thread": %d, "cpu_thread_start_time": %d'
                         % (rank, pid * 10, k0 - 20))
            tl.event("Forward", "Net", fwd0, fwd, step)
        tl.event(STEP_PHASE, STEP_PHASE, t, dur, step)
        t += dur + 200
        step += 1
    tl.seal()
    return tl.events, step


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out")
    ap.add_argument("--minutes", type=float, default=60)
    ap.add_argument("--ranks", type=int, default=8)
    ap.add_argument("--gpus", type=int, default=8)
    ap.add_argument("--cores", type=int, default=8)
    ap.add_argument("--interval", type=float, default=0.1)
    ap.add_argument("--step-ms", type=float, default=100)
    ap.add_argument("--ops", type=int, default=200, help="CPU ops and GPU kernels per detailed step")
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=False)
    rng = random.Random(args.seed)
    lines = write_system(args.out, args, rng)
    events = steps = 0
    for rank in range(args.ranks):
        e, s = write_rank(args.out, args, rank, random.Random(args.seed * 1000 + rank))
        events += e
        steps += s
    end = "%.6f\n" % (START_S + args.minutes * 60)
    for sub in ("system", "framework"):
        with open(os.path.join(args.out, sub, "training_job_end.ts"), "x") as f:
            f.write(end)
    print(json.dumps({"system_lines": lines, "timeline_events": events, "steps": steps,
                      "start_s": START_S, "end_s": START_S + args.minutes * 60}))


if __name__ == "__main__":
    main()
