"""Write a synthetic profiled job in trainprof's on-disk formats (docs/formats.md).

    python bench/synth_job.py OUT [--minutes 60] [--nodes 1] [--ranks 8] [--gpus 8] [--cores 8] [--interval 0.1]
                                  [--straggler 5] [--straggler-slow 1.1] [--thermal-node N]

`--nodes` nodes (`algo-1`…`algo-N`), each with GPUs and cores, system metrics every `--interval`
seconds, and `--ranks` timelines per node (`<rank>-algo-<n>`, ranks numbered across the job):
every step (`Step:ModeKeys.TRAIN`) with a dataloader event, and every 5 minutes a detailed window
of 10 steps with `Forward`, its submodules, CPU ops and GPU kernels. Rank `--straggler` (5) is
`--straggler-slow` (10 %) slower, and one step in 1000 takes 10× as long. `--thermal-node N`
plants thermal throttling on `algo-N`'s GPUs (`ThrottleReasonsMask` 0x60 with the
`ThrottleSwThermal` and `ThrottleHwThermal` rows) from its first system file after a tenth of the
job to the end; with it, every other GPU tick of every node has a `ThrottleReasonsMask` of 0
(without it there are no mask rows, as before).

Many nodes are written compactly: node 1's system files and its ranks' timelines are made once
and written again for every other node with the node's name (and, for `--thermal-node`, the
throttle rows) put in; only the straggler's timeline is made on its own. So the nodes' values
are the same series (the same seed), which is enough for the report's benchmark and the fleet
tests, and 64 nodes cost about as much CPU as one plus the writing. What this writes
is what the agent and the hook write: the same names, line formats, spacing, rotation (a
timeline file a minute, a system file a minute, the last tick in a file of its own) and end
markers, so smdebug 1.0.34's readers read it (`bench/report_vs_smdebug.py` runs them on it).

Deterministic for a given seed. Used by the report benchmark; not a test fixture.
"""

import argparse
import json
import os
import random
import re
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


MASK_LINE = re.compile(r'\{"Type":"accelerator","Name":"(device\d+)","Dimension":"ThrottleReasonsMask","Value":0,'
                       r'"NodeId":"algo-1","Timestamp":([0-9.]+)\}\n')


def thermal(m):
    """A mask line of 0 → thermal throttling (0x20 | 0x40) with its two reason rows."""
    dev, ts = m.group(1), m.group(2)
    row = '{"Type":"accelerator","Name":"%s","Dimension":"%%s","Value":%%d,"NodeId":"algo-1","Timestamp":%s}\n' % (dev, ts)
    return row % ("ThrottleReasonsMask", 0x60) + row % ("ThrottleSwThermal", 1) + row % ("ThrottleHwThermal", 1)


class NodeFiles:
    """One system file's text (node 1's), written for every node: the name put in, and on
    `--thermal-node` after a tenth of the job the throttle rows."""

    def __init__(self, base, args):
        self.base, self.args, self.used = base, args, set()
        self.thermal_from = START_S + args.minutes * 6

    def write(self, second, text):
        s = second
        while s in self.used:
            s -= 1
        self.used.add(s)
        d = os.path.join(self.base, hour_folder(s))
        os.makedirs(d, exist_ok=True)
        for n in range(1, self.args.nodes + 1):
            t = text
            if n == self.args.thermal_node and second >= self.thermal_from:
                t = MASK_LINE.sub(thermal, t)
            if n != 1:
                t = t.replace('"NodeId":"algo-1"', '"NodeId":"algo-%d"' % n)
            with open(os.path.join(d, "%010d.algo-%d.json" % (s, n)), "x") as f:
                f.write(t)


def write_system(root, args, rng):
    """One line per metric per tick, one file a minute named by its first tick's second."""
    node = "algo-1"
    ticks = int(args.minutes * 60 / args.interval)
    base = os.path.join(root, "system", "incremental")
    out, name_s, lines = None, None, 0
    gpu_mem = [30.0 + g for g in range(args.gpus)]
    files = NodeFiles(base, args)

    class Out(list):
        def close(self):
            files.write(self.second, "".join(self))

    def open_file(second):
        o = Out()
        o.second = second
        return o

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
            if args.thermal_node:
                line("accelerator", "device%d" % g, "ThrottleReasonsMask", 0)
        line("i/o", "IOPS", "", rng.random() * 3000)
        line("i/o", "ReadThroughputInBytesPerSecond", "", rng.random() * 4e8)
        line("i/o", "WriteThroughputInBytesPerSecond", "", rng.random() * 4e7)
        line("network", "ReceiveBytesPerSecond", "Algorithm", rng.random() * 1e9)
        line("network", "TransmitBytesPerSecond", "Algorithm", rng.random() * 1e9)
        line("trainer", "CPUPercent", "ProcessTree", 400 + rng.random() * 300)
        line("trainer", "RSSBytes", "ProcessTree", 2e10 + k * 1000)
        line("trainer", "Processes", "ProcessTree", 9 + args.ranks)
        out.append("".join(buf))
        lines += len(buf)
    out.close()
    return lines * args.nodes


class Timeline:
    """One rank's writer: phases numbered in first-met order, a file sealed every minute."""

    def __init__(self, root, node, pid, base_us, nodes=None):
        self.root, self.node, self.pid, self.base = root, node, pid, base_us
        self.nodes = nodes  # (global rank of node 1's copy, ranks per node, nodes): written for each
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
        text = "[\n" + ",\n".join(self.lines) + "\n]"
        names = [self.node]
        if self.nodes is not None:
            rank, per, nodes, skip = self.nodes
            names = ["%d-algo-%d" % (rank + per * n, n + 1) for n in range(nodes) if rank + per * n != skip]
        for name in names:
            with open(os.path.join(d, "%d_%s_pythontimeline.json" % (t, name)), "x") as f:
                f.write(text)
        self.lines = None


def write_rank(root, args, rank, rng, copies=None, slow=1.0):
    """Rank `rank` of node 1 (`copies`: also every other node's rank of the same place, but
    the straggler), or with `slow` the straggler alone (its own node's name)."""
    per = args.ranks
    node = "%d-algo-%d" % (rank, rank // per + 1)
    local = rank % per
    pid = 4000 + local
    start_us = START_S * 1_000_000
    end_us = start_us + int(args.minutes * 60 * 1e6)
    tl = Timeline(root, node, pid, start_us + 2_000_000 + local * 1000, copies)
    t = start_us + 10_000_000  # initialisation: 10 s
    step = 0
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
                tl.event("gpu_functions-dev:%d" % local, "kernel_%d" % (op % 30), k0, int(dur * 0.9) // args.ops // 3,
                         step, ', "tid": 7, "device": %d, "start_cpu_thread": %d, "cpu_thread_start_time": %d'
                         % (local, pid * 10, k0 - 20))
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
    ap.add_argument("--nodes", type=int, default=1)
    ap.add_argument("--ranks", type=int, default=8, help="ranks per node")
    ap.add_argument("--straggler", type=int, default=5, help="the slow rank (numbered across the job)")
    ap.add_argument("--straggler-slow", type=float, default=1.1, help="its steps' factor")
    ap.add_argument("--thermal-node", type=int, default=0, help="algo-N throttles (thermal); 0: none")
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
    total = args.nodes * args.ranks
    for local in range(args.ranks):
        copies = (local, args.ranks, args.nodes, args.straggler)
        e, s = write_rank(args.out, args, local, random.Random(args.seed * 1000 + local), copies)
        n = sum(1 for k in range(args.nodes) if local + args.ranks * k != args.straggler)
        events += e * n
        steps += s * n
    if 0 <= args.straggler < total:
        rank = args.straggler
        e, s = write_rank(args.out, args, rank, random.Random(args.seed * 1000 + rank % args.ranks),
                          slow=args.straggler_slow)
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
