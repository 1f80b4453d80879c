"""Writes a synthetic LocalPath in the documented formats (docs/formats.md): SECONDS of system
metrics for one node (16 cores, 8 GPUs, every 100 ms, one file a minute) and RANKS timelines
(100 ms steps, each with a DataLoaderIter and a Forward event; a file a minute per rank).
For measuring `trainprof report` / `trainprof trace` on a long job:

    python3 tests/report/scripts/synthetic_job.py OUT [SECONDS=3600] [RANKS=8]
"""

import json
import os
import pathlib
import sys
import time

out = pathlib.Path(sys.argv[1])
seconds = int(sys.argv[2]) if len(sys.argv) > 2 else 3600
ranks = int(sys.argv[3]) if len(sys.argv) > 3 else 8
start = 1795400000
CORES, GPUS, TICK = 16, 8, 0.1


def hour(t):
    return time.strftime("%Y%m%d%H", time.gmtime(t))


def line(typ, name, dim, v, t):
    return '{"Type":"%s","Name":"%s","Dimension":"%s","Value":%s,"NodeId":"algo-1","Timestamp":%s}\n' % (
        typ, name, dim, v, t)


for minute in range(start, start + seconds, 60):
    d = out / "system" / "incremental" / hour(minute)
    d.mkdir(parents=True, exist_ok=True)
    with open(d / f"{minute}.algo-1.json", "w") as f:
        for k in range(int(60 / TICK)):
            t = round(minute + k * TICK, 6)
            rows = []
            for c in range(CORES):
                rows.append(line("cpu", f"cpu{c}", "CPUUtilization", 40 + (c * 7 + k) % 50, t))
                rows.append(line("cpu", f"cpu{c}", "I/OWaitPercentage", (c + k) % 5, t))
            rows.append(line("host", "AllCores", "BusyPercent", 60, t))
            rows.append(line("host", "AllCores", "IOWaitPercent", 2, t))
            rows.append(line("memory", "MemoryUsedPercent", "", 41.5, t))
            for g in range(GPUS):
                rows.append(line("gpu", f"gpu{g}", "GPUUtilization", 70 + (g + k) % 25, t))
                rows.append(line("gpu", f"gpu{g}", "GPUMemoryUtilization", 55 + g, t))
            rows.append(line("i/o", "ReadThroughputInBytesPerSecond", "", 1048576, t))
            rows.append(line("i/o", "WriteThroughputInBytesPerSecond", "", 524288, t))
            rows.append(line("network", "ReceiveBytesPerSecond", "Algorithm", 2097152, t))
            rows.append(line("network", "TransmitBytesPerSecond", "Algorithm", 2097152, t))
            rows.append(line("trainer", "CPUPercent", "ProcessTree", 750, t))
            rows.append(line("trainer", "RSSBytes", "ProcessTree", 8e9, t))
            f.write("".join(rows))

for rank in range(ranks):
    node = f"{rank}-algo-1"
    base = start * 1_000_000
    step = 0
    for minute in range(start, start + seconds, 60):
        end_us = (minute + 60) * 1_000_000
        d = out / "framework" / "pevents" / hour(minute + 60)
        d.mkdir(parents=True, exist_ok=True)
        ev = [
            {"name": "process_name", "ph": "M", "pid": 0, "args": {"start_time_since_epoch_in_micros": base}},
            {"name": "process_name", "ph": "M", "pid": 1, "args": {"name": "DataLoaderIter"}},
            {"name": "process_name", "ph": "M", "pid": 2, "args": {"name": "Forward"}},
            {"name": "process_name", "ph": "M", "pid": 3, "args": {"name": "Step:ModeKeys.TRAIN"}},
        ]
        for k in range(600):
            ts = (minute - start) * 1_000_000 + k * 100_000
            a = {"pid": 1000 + rank, "step_num": str(step)}
            ev.append({"name": "_SingleProcessDataLoaderIter.DataLoaderIter::GetNext", "pid": 1, "ph": "X", "ts": ts, "dur": 5000, "args": a})
            ev.append({"name": "Net", "pid": 2, "ph": "X", "ts": ts + 6000, "dur": 40000 + rank * 1000, "args": a})
            ev.append({"name": "Step:ModeKeys.TRAIN", "pid": 3, "ph": "X", "ts": ts, "dur": 95000, "args": a})
            step += 1
        with open(d / f"{end_us}_{node}_pythontimeline.json", "w") as f:
            f.write("[\n" + ",\n".join(json.dumps(e) for e in ev) + "\n]")
