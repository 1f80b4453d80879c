"""Benchmark (not a test): what the GPU sampler costs the agent per tick, over the fake
libnvidia-ml.so.1 (agent/tests/c/fake_nvml.c) made to cost what a real driver costs.

    python bench/gpu_cost.py                 # TRAINPROF_BIN: the agent; 20 s per run
    BENCH_AGENT_BEFORE=/path/to/trainprof python bench/gpu_cost.py   # and another build beside it

The fake spends, in CPU time, what each NVML call cost on an H200 (driver 580, nvidia-ml-py,
mean of 30 calls; the upper end where a range was measured): COSTS below, passed as
FAKE_NVML_COST_US. The agent's own account of each run (system/cost/, docs/formats.md, "The
agent's own cost") is printed beside the outside measurement: its share per part. Its sample buffers fill with the wall clock (5 samples a second, 70 held:
14 s, as the H200's). Built with cc for 1 and 8 GPUs (-DFAKE_NVML_DEVICES).

Runs, one after the other (BENCH_ROUNDS rounds, order alternating), each `trainprof run
--interval-ms 100 -- sleep` (a trainer tree: the process queries run too):
  no GPU     TRAINPROF_NVML_LIB naming no library: the agent's floor
  1 GPU      the fake with one GPU
  8 GPUs     the fake with eight (its gpu1 supports less: docs in fake_nvml.c)
and with BENCH_AGENT_BEFORE the same three with that binary (e.g. main's build).

Measured from outside as bench/agent_vs_psutil.py does (its `measure`): the agent's CPU time
(the sum of /proc/<pid>/task/*/schedstat) between its first tick and BENCH_SECONDS later,
divided by the ticks written meanwhile; VmRSS at the end. Per GPU = (with GPUs - no GPU) / GPUs.
"""

import json
import os
import shutil
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from agent_vs_psutil import combine, core_percent, measure, notes, us_per_tick  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FAKE = os.path.join(ROOT, "agent", "tests", "c", "fake_nvml.c")

# µs of CPU per call on the H200 (BENCHMARKS.md, "On real H200s": scripts/gpu-check's NVML part,
# nvidia-ml-py, mean of 30 calls, the upper end of the runs). Field ids: 83 energy, 197/198 PCIe
# TX/RX, 138/139 NVLink TX/RX, 186 instant power, 3-6 ECC. nvmlDeviceGetProcessUtilization was
# not measured there; the agent's own account (docs/formats.md, "The agent's own cost") shows
# it called at the buffers' cadence, so it is charged what a sample buffer cost.
COSTS = {
    "nvmlDeviceGetUtilizationRates": 127,
    "nvmlDeviceGetPowerUsage": 63,
    "nvmlDeviceGetTemperature": 19,
    "nvmlDeviceGetClockInfo": 17,
    "nvmlDeviceGetCurrentClocksThrottleReasons": 15,
    "nvmlEventSetWait_v2": 4,
    "nvmlDeviceGetMemoryInfo_v2": 8,
    "nvmlDeviceGetComputeRunningProcesses_v3": 10,
    "nvmlDeviceGetSamples": 2630,
    "nvmlDeviceGetProcessUtilization": 2630,
    "nvmlGpmSampleGet": 50,
    "nvmlGpmMetricsGet": 127,
    "nvmlDeviceGetFieldValues:83": 4040,
    "nvmlDeviceGetFieldValues:197": 230,
    "nvmlDeviceGetFieldValues:198": 230,
    "nvmlDeviceGetFieldValues:138": 14,
    "nvmlDeviceGetFieldValues:139": 14,
    "nvmlDeviceGetFieldValues:186": 14,
    "nvmlDeviceGetFieldValues:3": 14,
    "nvmlDeviceGetFieldValues:4": 14,
    "nvmlDeviceGetFieldValues:5": 14,
    "nvmlDeviceGetFieldValues:6": 14,
}
COST_ENV = ",".join("%s=%g" % kv for kv in COSTS.items())
GOAL_US_PER_GPU = 100.0


def build(tmp, gpus):
    out = os.path.join(tmp, "fake-%d" % gpus)
    os.makedirs(out)
    lib = os.path.join(out, "libnvidia-ml.so.1")
    subprocess.run([shutil.which("cc") or "cc", "-shared", "-fPIC", "-O2", "-DFAKE_NVML_DEVICES=%d" % gpus,
                    "-o", lib, FAKE], check=True)
    return lib


def own_account(out):
    """The agent's own record of the run (docs/formats.md, "The agent's own cost"), or None."""
    folder = os.path.join(out, "system", "cost", "algo-1")
    try:
        [name] = os.listdir(folder)
        with open(os.path.join(folder, name)) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def print_accounts(accounts):
    """Per part, µs per tick by the agent's own account (rounds summed), each build and GPU count;
    µs per call as the agent measured it on its timed calls (the last round's)."""
    for (who, gpus), recs in sorted(accounts.items()):
        ticks = sum(r["Ticks"] for r in recs) or 1
        cpu = sum(r["CpuSeconds"] for r in recs)
        parts = {}
        calls = {}
        measured = {}
        for r in recs:
            for p in r["Parts"]:
                parts[p["Part"]] = parts.get(p["Part"], 0.0) + p["Seconds"]
                calls[p["Part"]] = calls.get(p["Part"], 0) + p["Calls"]
                if p.get("MicrosPerCall") is not None:
                    measured[p["Part"]] = p["MicrosPerCall"]
        print()
        print("the agent's own account, %s, %d GPU%s: %.1f µs CPU per tick over the whole run (start-up included), "
              "parts %.0f %% of it, the accounting %.2f %%"
              % (who, gpus, "s" * (gpus != 1), cpu / ticks * 1e6, sum(parts.values()) / cpu * 100 if cpu else 0,
                 sum(r["AccountingSeconds"] for r in recs) / cpu * 100 if cpu else 0))
        print("| part | µs / tick | µs / GPU / tick | calls / tick | µs / call |")
        print("|---|---:|---:|---:|---:|")
        for part, sec in sorted(parts.items(), key=lambda kv: -kv[1]):
            per_tick = sec / ticks * 1e6
            per_call = measured.get(part)
            print("| %s | %.1f | %s | %.2f | %s |" % (
                part, per_tick, "%.1f" % (per_tick / gpus) if gpus and part.startswith("nvml.") else "",
                calls[part] / ticks, "%.1f" % per_call if per_call is not None else ""))


def main():
    binary = os.environ.get("TRAINPROF_BIN") or os.path.join(ROOT, "target", "release", "trainprof")
    before = os.environ.get("BENCH_AGENT_BEFORE")
    seconds = float(os.environ.get("BENCH_SECONDS", "20"))
    rounds = int(os.environ.get("BENCH_ROUNDS", "2"))
    interval_ms = 100
    tmp = tempfile.mkdtemp(prefix="trainprof-gpu-cost-")
    libs = {0: os.path.join(tmp, "no-such-dir", "libnvidia-ml.so.1"), 1: build(tmp, 1), 8: build(tmp, 8)}
    bins = [("after", binary)] + ([("before", before)] if before else [])
    runs = {}
    accounts = {}
    for rnd in range(rounds):
        order = [(who, b, g) for who, b in bins for g in (0, 1, 8)]
        if rnd % 2:
            order.reverse()
        for who, b, gpus in order:
            out = os.path.join(tmp, "%s-%d-%d" % (who, gpus, rnd))
            env = dict(os.environ, TRAINPROF_NVML_LIB=libs[gpus], FAKE_NVML_COST_US=COST_ENV)
            argv = [b, "run", "--interval-ms", str(interval_ms), "--local-path", out, "--", "sleep", "3600"]
            saved = dict(os.environ)
            os.environ.clear()
            os.environ.update(env)
            try:
                r = measure("%s %d GPU" % (who, gpus), argv, out, seconds, interval_ms,
                            os.path.join(tmp, "%s-%d-%d.log" % (who, gpus, rnd)))
            finally:
                os.environ.clear()
                os.environ.update(saved)
            runs.setdefault((who, gpus), []).append(r)
            rec = own_account(out)
            if rec is not None:
                accounts.setdefault((who, gpus), []).append(rec)
            print("  %-6s %d GPU round %d: %.1f µs/tick over %d ticks, RSS %.1f MiB"
                  % (who, gpus, rnd, us_per_tick(r), r["ticks"], r["rss_kib"] / 1024.0), flush=True)

    print()
    print("agent CPU per tick at %d ms, fake NVML at the H200's cost per call (%d rounds of %.0f s)"
          % (interval_ms, rounds, seconds))
    print("| build | GPUs | µs / tick | µs / GPU / tick over no GPU | % of one core | RSS MiB | ticks |")
    print("|---|---|---|---|---|---|---|")
    for who, _ in bins:
        base = us_per_tick(combine(runs[(who, 0)]))
        for gpus in (0, 1, 8):
            r = combine(runs[(who, gpus)])
            per_gpu = (us_per_tick(r) - base) / gpus if gpus else None
            print("| %s | %d | %.1f | %s | %.2f | %.1f | %d |"
                  % (who, gpus, us_per_tick(r), "%.1f" % per_gpu if per_gpu is not None else "–",
                     core_percent(r), r["rss_kib"] / 1024.0, r["ticks"]))
            if gpus:
                result = {"metric": "agent CPU per GPU per tick, %d GPU%s (%s)" % (gpus, "s" * (gpus > 1), who),
                          "unit": "µs", "trainprof": per_gpu, "peer": GOAL_US_PER_GPU, "peer_name": "goal",
                          "better": "lower"}
                if who == "after":
                    print("RESULT " + json.dumps(result))
    print_accounts(accounts)
    if before:
        for gpus in (1, 8):
            a, b = (us_per_tick(combine(runs[(w, gpus)])) - us_per_tick(combine(runs[(w, 0)])) for w in ("after", "before"))
            print("%d GPU%s: before / after per GPU: %.0f×" % (gpus, "s" * (gpus > 1), b / a if a > 0 else float("inf")))
    for n in notes:
        print("note: " + n)
    print("logs: %s" % tmp)


if __name__ == "__main__":
    main()
