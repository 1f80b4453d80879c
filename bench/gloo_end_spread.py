"""How far apart four gloo ranks end one all-reduce on one clock, without trainprof
(docs/report.md, "Clock alignment"): the torch tier's job (tests/frameworks/torch/scripts/
ddp_ranks.py: a two-layer model in DistributedDataParallel over gloo, rank 3 sleeping 20 ms
before each forward) under plain ``torch.profiler`` for 40 steps, every rank on this machine.
Per all-reduce, the spread of the ranks' ``gloo:all_reduce`` ends: what the tier's aligned
trace can at best show, since alignment removes clock error, not the ranks' own completion.

    .venv-torch/bin/python bench/gloo_end_spread.py     # BENCH_ROUNDS=3

Prints one line per round, then the median of the medians and 90th percentiles and the
largest spread (ms). A measurement, not a side-by-side benchmark: bench/run.py does not run it."""

import datetime
import json
import os
import statistics
import sys
import tempfile
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn

WORLD = 4
LATE_RANK = 3
STEPS = 40


def rank_main(rank, store, out):
    torch.manual_seed(0)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method="file://" + store, rank=rank, world_size=WORLD,
                            timeout=datetime.timedelta(seconds=120))
    model = nn.parallel.DistributedDataParallel(nn.Sequential(nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 1)))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = torch.randn(16, 32), torch.randn(16, 1)

    def step():
        if rank == LATE_RANK:
            time.sleep(0.02)
        opt.zero_grad()
        ((model(x) - y) ** 2).mean().backward()
        opt.step()
        time.sleep(0.02)

    for _ in range(10):
        step()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        for _ in range(STEPS):
            step()
    prof.export_chrome_trace(os.path.join(out, f"rank{rank}.json"))
    dist.destroy_process_group()


def ends(path):
    """The rank's gloo all-reduce ends, µs on the clock every process of this machine shares
    (kineto's `ts` and its fixed `baseTimeNanoseconds`), in call order."""
    with open(path) as f:
        t = json.load(f)
    return sorted(e["ts"] + e["dur"] for e in t["traceEvents"]
                  if e.get("ph") == "X" and str(e.get("name", "")).startswith("gloo:all_reduce"))


def one_round():
    with tempfile.TemporaryDirectory() as out:
        mp.spawn(rank_main, args=(os.path.join(out, "store"), out), nprocs=WORLD)
        by_rank = [ends(os.path.join(out, f"rank{r}.json")) for r in range(WORLD)]
    n = min(len(v) for v in by_rank)
    return sorted((max(v[i] for v in by_rank) - min(v[i] for v in by_rank)) / 1000.0 for i in range(n))


def main():
    rounds = int(os.environ.get("BENCH_ROUNDS", "3"))
    medians, p90s, maxes = [], [], []
    for r in range(rounds):
        s = one_round()
        med, p90, top = s[len(s) // 2], s[int(len(s) * 0.9)], s[-1]
        medians.append(med)
        p90s.append(p90)
        maxes.append(top)
        load = os.getloadavg()[0]
        print(f"round {r + 1}: {len(s)} all-reduces, end spread median {med:.3f} ms, "
              f"p90 {p90:.3f} ms, max {top:.3f} ms (load {load:.2f})", flush=True)
    print(f"over the rounds: median {statistics.median(medians):.3f} ms")
    print(f"over the rounds: 90th percentile {statistics.median(p90s):.3f} ms")
    print(f"over the rounds: largest {max(maxes):.3f} ms")


if __name__ == "__main__":
    sys.exit(main())
