"""One prepared run on a GPU machine (scripts/gpu-check): what trainprof costs and what it gets
right on real hardware, as one markdown summary on stdout (and in $OUT/gpu-check.md when OUT is
set). Nothing is fetched: it needs python3 with torch, torchvision and nvidia-ml-py (pynvml)
for every part, and a built `trainprof` (TRAINPROF_BIN, else target/release/trainprof, else
target/debug/trainprof) with libtrainprof_hook.so beside it (or TRAINPROF_HOOK_LIB).

Parts, in order; each has its own timeout, a part that fails prints its error and the rest go on,
and a part whose prerequisites are missing (no pynvml, no torch, no CUDA device) says so:

  nvml     CPU µs per NVML call (nvidia-ml-py, mean of 30 calls, thread CPU time and wall): the
           cheap instant reads, memory, processes, the two sample buffers from 0 and from their
           newest sample (and how many samples and seconds one read returns), the per-process
           utilisation from 0 and from a second ago, the agent's field batch and each field
           alone, the energy counter, GPM sample and metrics.
  agent    `trainprof agent --interval-ms 100` for GPU_CHECK_AGENT_SECONDS (20) with the GPU and,
           at the same time, another with NVML pointed at a library that does not exist (the
           agent then samples no GPU): CPU per tick from /proc/<pid>/task/*/schedstat, from the
           first written tick on; RSS at the end. Beside it the agent's own account of each
           run (system/cost/, docs/formats.md "The agent's own cost"): its share of a core
           against the outside figure, µs per tick and per call of every part (each kind of
           NVML call per GPU), and the per-GPU cost both ways.
  train    bench/gpu_train.py (ResNet-50, bf16, synthetic data) for GPU_CHECK_TRAIN_SECONDS
           (25) each: plain; under `trainprof run --interval-ms 100` with the adapter and no
           window, beside an nvidia-ml-py sampler of GPU 0 every 100 ms (GPU utilisation: the
           agent's rows against it over the same span); and with every window (detailed
           200-201, dataloader 220-229, python 240-242, native 260-279) plus
           AutoProfilingConfig and a planted 0.6 s step at 330: the trigger must fire on 330
           and on nothing else (the windows' closes must not), and the step time before the
           windows is set beside the step time after them.
  windows  (only when GPU_CHECK_PARTS names it) steps after each kind of window, one loop each.
  job      (only when GPU_CHECK_PARTS names it) one job with every window of
           tests/fixtures/h200-resnet50/profilerconfig.json, then `trainprof report --json` on it
           there: the detailed windows' figures (busy, idle categories, kernel classes, launch
           delay) and whether the kernels' events carry the stream, correlation id and launch
           time; the job's LocalPath packed as $OUT/job.tar.gz (a fixture like that one).
  nccl     (only when GPU_CHECK_PARTS names it) bench/gpu_nccl.py: a world-size-1 NCCL job
           (DistributedDataParallel and an all-reduce per step) under `trainprof run` with a
           detailed window of steps 20-24, then `trainprof report --json`: the collectives it
           read (`collectives.records`, the NCCL kernels among them, both eras counted as
           communication) and the communication-against-compute figure
           (`detailed.total.comm_overlap`, per window too). Fails when the report has no
           collectives; says so (not a failure) when NCCL's one-rank path launched no kernel.
  memory   (only when GPU_CHECK_PARTS names it) bench/gpu_memory.py: ResNet-18 keeping 8 MiB
           a step (a planted leak), then asking for more than the GPU holds at step 30, under
           `trainprof run` with a memory window of steps 10-17 and `OomSnapshot`, and the same
           script without trainprof: both exit statuses, the snapshots (one of the window, one
           at the error), whether the exception dump names the snapshot, and per snapshot the
           report's peak, top frames, leak and the agent's figure; GPUMemoryLeak.

The whole run stays under 5 minutes on a 16-core GPU machine (GPU_CHECK_DEADLINE_S, 285: a
part that would not fit in what is left is skipped and says so).
"""

import glob
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time

from proc_cpu import cpu_ns  # bench/proc_cpu.py

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PY = sys.executable
START = time.monotonic()
DEADLINE = float(os.environ.get("GPU_CHECK_DEADLINE_S", "285"))
AGENT_S = float(os.environ.get("GPU_CHECK_AGENT_SECONDS", "20"))
TRAIN_S = float(os.environ.get("GPU_CHECK_TRAIN_SECONDS", "25"))
SLOW_STEP = 330
# The agent's field batch (agent/src/pipeline/sample/gpu/mod.rs, `Field`): id, scope.
FIELDS = [(197, 0), (198, 0), (138, 0xFFFFFFFF), (139, 0xFFFFFFFF), (186, 0), (83, 0), (3, 0), (4, 0), (5, 0), (6, 0)]
FIELD_NAMES = {197: "PCIe TX bytes", 198: "PCIe RX bytes", 138: "NVLink TX", 139: "NVLink RX", 186: "instant power",
               83: "total energy", 3: "ECC SBE vol", 4: "ECC DBE vol", 5: "ECC SBE agg", 6: "ECC DBE agg"}


def left():
    return DEADLINE - (time.monotonic() - START)


# --- the NVML part (run in a child process: `gpu_check.py --part nvml`) -------------------------

def nvml_part():
    """JSON on stdout: per-call costs on GPU 0."""
    import pynvml

    lib = os.environ.get("TRAINPROF_NVML_LIB")
    if lib:
        # The library the agent is told to load, for nvidia-ml-py too.
        import ctypes

        pynvml.nvmlLib = ctypes.CDLL(lib)
    init(pynvml)
    out = {"gpus": pynvml.nvmlDeviceGetCount(), "calls": []}
    h = pynvml.nvmlDeviceGetHandleByIndex(0)
    for key, fn in (("driver", pynvml.nvmlSystemGetDriverVersion), ("name", lambda: pynvml.nvmlDeviceGetName(h))):
        try:
            out[key] = _s(fn())
        except pynvml.NVMLError as e:
            out[key] = "unknown (%s)" % e

    def timed(label, fn, n=30):
        cpu, wall, err = [], [], None
        for _ in range(n):
            c0, w0 = time.thread_time_ns(), time.perf_counter_ns()
            try:
                fn()
            except pynvml.NVMLError as e:
                err = str(e)
            cpu.append(time.thread_time_ns() - c0)
            wall.append(time.perf_counter_ns() - w0)
        out["calls"].append({"call": label, "cpu_us": statistics.mean(cpu) / 1e3,
                             "wall_us": statistics.mean(wall) / 1e3, "error": err})

    def reasons(h):
        # "Clocks event reasons" in newer NVML, "throttle reasons" in older (same bits).
        try:
            return pynvml.nvmlDeviceGetCurrentClocksEventReasons(h)
        except (pynvml.NVMLError_FunctionNotFound, AttributeError):
            return pynvml.nvmlDeviceGetCurrentClocksThrottleReasons(h)

    timed("nvmlDeviceGetUtilizationRates", lambda: pynvml.nvmlDeviceGetUtilizationRates(h))
    timed("nvmlDeviceGetPowerUsage", lambda: pynvml.nvmlDeviceGetPowerUsage(h))
    timed("nvmlDeviceGetTemperature", lambda: pynvml.nvmlDeviceGetTemperature(h, pynvml.NVML_TEMPERATURE_GPU))
    timed("nvmlDeviceGetClockInfo (SM)", lambda: pynvml.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_SM))
    timed("clock event reasons", lambda: reasons(h))
    try:
        es = pynvml.nvmlEventSetCreate()
        try:
            pynvml.nvmlDeviceRegisterEvents(h, pynvml.nvmlEventTypeXidCriticalError, es)
        except pynvml.NVMLError:
            pass

        def wait0():
            try:
                pynvml.nvmlEventSetWait_v2(es, 0)
            except pynvml.NVMLError_Timeout:
                pass

        timed("event wait(0)", wait0)
    except (pynvml.NVMLError, AttributeError) as e:
        out["calls"].append({"call": "event wait(0)", "error": str(e)})
    mem_v2 = getattr(pynvml, "nvmlMemory_v2", None)
    timed("nvmlDeviceGetMemoryInfo" + ("_v2" if mem_v2 else ""),
          lambda: pynvml.nvmlDeviceGetMemoryInfo(h, version=mem_v2) if mem_v2 else pynvml.nvmlDeviceGetMemoryInfo(h))
    timed("nvmlDeviceGetComputeRunningProcesses", lambda: pynvml.nvmlDeviceGetComputeRunningProcesses(h))
    for label, kind in (("GPU", pynvml.NVML_GPU_UTILIZATION_SAMPLES), ("memory", pynvml.NVML_MEMORY_UTILIZATION_SAMPLES)):
        try:
            _, samples = pynvml.nvmlDeviceGetSamples(h, kind, 0)
            ts = [s.timeStamp for s in samples]
            span = (max(ts) - min(ts)) / 1e6 if ts else 0.0
            out.setdefault("buffers", []).append({"buffer": label, "samples": len(ts), "span_s": span})
        except pynvml.NVMLError as e:
            out.setdefault("buffers", []).append({"buffer": label, "error": str(e)})
        timed("nvmlDeviceGetSamples (%s buffer, from 0)" % label, lambda k=kind: pynvml.nvmlDeviceGetSamples(h, k, 0))
        # The agent reads a buffer from the newest sample it has seen (docs/formats.md, "GPU:
        # cadence"); whether the driver charges that what it charges a read from 0 decides how
        # often a buffer can be read in place of the instant utilisation.
        newest = newest_sample(pynvml, h, kind)
        if newest is not None:
            timed("nvmlDeviceGetSamples (%s buffer, from its newest sample)" % label,
                  lambda k=kind, t=newest: pynvml.nvmlDeviceGetSamples(h, k, t))
    # The per-process buffer the agent reads with the others (charged in the fake as a sample
    # buffer, never measured before): from 0, and from a second ago. NVML says "not found"
    # when no process ran in that time; the error is then the note.
    timed("nvmlDeviceGetProcessUtilization (from 0)", lambda: pynvml.nvmlDeviceGetProcessUtilization(h, 0))
    recent = int(time.time() * 1e6) - 1_000_000
    timed("nvmlDeviceGetProcessUtilization (from 1 s ago)",
          lambda: pynvml.nvmlDeviceGetProcessUtilization(h, recent))
    timed("nvmlDeviceGetFieldValues, the agent's 10 fields", lambda: pynvml.nvmlDeviceGetFieldValues(h, FIELDS))
    for fid, scope in FIELDS:
        timed("... field %d (%s) alone" % (fid, FIELD_NAMES[fid]),
              lambda f=(fid, scope): pynvml.nvmlDeviceGetFieldValues(h, [f]))
    timed("nvmlDeviceGetTotalEnergyConsumption", lambda: pynvml.nvmlDeviceGetTotalEnergyConsumption(h))
    try:
        s1, s2 = pynvml.nvmlGpmSampleAlloc(), pynvml.nvmlGpmSampleAlloc()
        pynvml.nvmlGpmSampleGet(h, s1)
        timed("nvmlGpmSampleGet", lambda: pynvml.nvmlGpmSampleGet(h, s2))

        def metrics():
            mg = pynvml.c_nvmlGpmMetricsGet_t()
            mg.version = pynvml.NVML_GPM_METRICS_GET_VERSION
            mg.numMetrics = 4
            mg.sample1, mg.sample2 = s1, s2
            for i, m in enumerate(("SM_UTIL", "SM_OCCUPANCY", "ANY_TENSOR_UTIL", "DRAM_BW_UTIL")):
                mg.metrics[i].metricId = getattr(pynvml, "NVML_GPM_METRIC_" + m)
            pynvml.nvmlGpmMetricsGet(mg)

        timed("nvmlGpmMetricsGet (4 metrics)", metrics)
    except (pynvml.NVMLError, AttributeError) as e:
        out["calls"].append({"call": "GPM", "error": str(e)})
    pynvml.nvmlShutdown()
    print(json.dumps(out))


def newest_sample(pynvml, h, kind):
    """The timestamp of a sample buffer's newest sample, or None when it has none."""
    try:
        _, samples = pynvml.nvmlDeviceGetSamples(h, kind, 0)
    except pynvml.NVMLError:
        return None
    return max((s.timeStamp for s in samples), default=None)


def init(pynvml):
    """nvmlInit, or nvmlInit_v2 where the library has no nvmlInitWithFlags (older drivers, the
    tests' fake)."""
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError_FunctionNotFound:
        ret = pynvml._nvmlGetFunctionPointer("nvmlInit_v2")()
        pynvml._nvmlCheckReturn(ret)


def _s(v):
    return v.decode() if isinstance(v, bytes) else str(v)


# --- the oracle sampler (a child process: `gpu_check.py --part oracle FILE`) ----------------------

def oracle_part(path):
    """GPU 0's utilisation every 100 ms (`time util` lines) until terminated."""
    import pynvml

    lib = os.environ.get("TRAINPROF_NVML_LIB")
    if lib:
        import ctypes

        pynvml.nvmlLib = ctypes.CDLL(lib)
    init(pynvml)
    h = pynvml.nvmlDeviceGetHandleByIndex(0)
    stop = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
    with open(path, "w") as f:
        nxt = time.monotonic()
        while not stop:
            f.write("%.6f %d\n" % (time.time(), pynvml.nvmlDeviceGetUtilizationRates(h).gpu))
            f.flush()
            nxt += 0.1
            time.sleep(max(0.0, nxt - time.monotonic()))


# --- helpers --------------------------------------------------------------------------------------

def rss_kib(pid):
    try:
        with open("/proc/%d/status" % pid) as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return None


def system_rows(root):
    """Every system metrics line under `root` (docs/formats.md, "System files: line format")."""
    rows = []
    for path in sorted(glob.glob(os.path.join(root, "system", "incremental", "*", "*.json"))):
        with open(path, errors="replace") as f:
            for line in f:
                try:
                    rows.append(json.loads(line))
                except ValueError:
                    pass
    return rows


def find_bin():
    for cand in (os.environ.get("TRAINPROF_BIN"), os.path.join(ROOT, "target", "release", "trainprof"),
                 os.path.join(ROOT, "target", "debug", "trainprof")):
        if cand and os.access(cand, os.X_OK):
            return cand
    return None


def base_env(tmp):
    env = {k: v for k, v in os.environ.items() if not k.startswith("SMPROFILER_")}
    env["SMPROFILER_CONFIG_PATH"] = os.path.join(tmp, "no-profilerconfig.json")
    env["TRAINPROF_RESOURCE_CONFIG"] = os.path.join(tmp, "no-resourceconfig.json")
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [os.path.join(ROOT, "hook-ffi", "python"), env.get("PYTHONPATH")]))
    return env


def median_ms(xs):
    return 1e3 * statistics.median(xs) if xs else float("nan")


# --- the parts ------------------------------------------------------------------------------------

def part_nvml(ctx, md):
    md.append("## NVML per-call cost (nvidia-ml-py, GPU 0, mean of 30 calls)\n")
    if not ctx["pynvml"]:
        md.append("skipped: nvidia-ml-py (pynvml) is not installed for %s\n" % PY)
        return
    r = subprocess.run([PY, os.path.abspath(__file__), "--part", "nvml"], capture_output=True, text=True,
                       timeout=min(90, max(5, left())), env=ctx["env"])
    if r.returncode != 0:
        raise RuntimeError("exit %d: %s" % (r.returncode, r.stderr.strip()[-800:]))
    d = json.loads(r.stdout.strip().splitlines()[-1])
    md.append("%d GPU(s), GPU 0: %s, driver %s\n" % (d["gpus"], d.get("name"), d.get("driver")))
    md.append("| call | CPU µs | wall µs | note |\n|---|---:|---:|---|")
    for c in d["calls"]:
        cpu = "%.1f" % c["cpu_us"] if "cpu_us" in c else "-"
        wall = "%.1f" % c["wall_us"] if "wall_us" in c else "-"
        md.append("| %s | %s | %s | %s |" % (c["call"], cpu, wall, c.get("error") or ""))
    md.append("")
    for b in d.get("buffers", []):
        if "error" in b:
            md.append("* %s sample buffer: %s" % (b["buffer"], b["error"]))
        else:
            md.append("* %s sample buffer read from 0: %d samples over %.1f s" % (b["buffer"], b["samples"], b["span_s"]))
    md.append("")


def measure_agent(ctx, label, nvml_lib, seconds, results, binary=None):
    tmp = ctx["tmp"]
    out = os.path.join(tmp, "agent-" + label)
    env = dict(ctx["env"])
    if nvml_lib is not None:
        env["TRAINPROF_NVML_LIB"] = nvml_lib
    log = open(os.path.join(tmp, "agent-%s.log" % label), "w+")
    proc = subprocess.Popen([binary or ctx["bin"], "agent", "--interval-ms", "100", "--local-path", out],
                            stdout=subprocess.DEVNULL, stderr=log, env=env)
    try:
        t_end = time.monotonic() + 30
        while not any(os.path.getsize(p) > 0 for p in glob.glob(os.path.join(out, "system", ".*.tmp"))
                      + glob.glob(os.path.join(out, "system", "incremental", "*", "*.json"))):
            if proc.poll() is not None or time.monotonic() > t_end:
                raise RuntimeError("no system file within 30 s (exit %s)" % proc.poll())
            time.sleep(0.05)
        time.sleep(1.0)  # past the start-up (the GPU probe, the first sample buffer read)
        c0, w0 = cpu_ns(proc.pid), time.monotonic()
        time.sleep(seconds)
        c1, w1 = cpu_ns(proc.pid), time.monotonic()
        rss = rss_kib(proc.pid)
        ticks = (w1 - w0) / 0.1
        results[label] = {"us_per_tick": (c1 - c0) / 1e3 / ticks, "core_pct": (c1 - c0) / 1e9 / (w1 - w0) * 100,
                          "rss_mib": rss / 1024 if rss else float("nan")}
    except Exception as e:  # reported in the table
        results[label] = {"error": "%s: %s" % (type(e).__name__, e)}
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.seek(0)
        tail = [line for line in log.read().splitlines() if "ticks:" in line or "agent:" in line]
        results.setdefault(label, {})["log"] = tail[-3:]
        log.close()
        results[label]["own"] = own_account(out)
        results[label]["gpu_rows"] = sum(1 for r in system_rows(out) if r.get("Type") in ("gpu", "accelerator"))


def own_account(out):
    """The agent's own record of its cost (docs/formats.md, "The agent's own cost"), or None."""
    for path in sorted(glob.glob(os.path.join(out, "system", "cost", "*", "*.json"))):
        try:
            with open(path) as f:
                return json.load(f)
        except (OSError, ValueError):
            pass
    return None


def own_table(md, results, labels):
    """The agent's own per-part account beside the outside measurement: its CPU share against
    schedstat's, and per part µs per tick and per call (per GPU for the NVML kinds)."""
    for label in labels:
        rec = results.get(label, {}).get("own")
        if not rec:
            md.append("* %s: no record of its own cost (system/cost/)" % label)
            continue
        ticks = max(rec["Ticks"], 1)
        gpus = max(rec.get("Gpus", 0), 1)
        outside = results[label].get("core_pct")
        md.append("**%s, by its own account**: %.3f %% of a core over its %.0f s (outside, after start-up: %s), "
                  "parts %.0f %% of its CPU, the accounting %.2f %%, %d of %d ticks timed in full\n"
                  % (label, rec["CpuSeconds"] / max(rec["WallSeconds"], 1e-9) * 100, rec["WallSeconds"],
                     "%.3f %%" % outside if outside is not None else "none",
                     sum(p["Seconds"] for p in rec["Parts"]) / max(rec["CpuSeconds"], 1e-9) * 100,
                     rec["AccountingSeconds"] / max(rec["CpuSeconds"], 1e-9) * 100, rec["TimedTicks"], rec["Ticks"]))
        md.append("| part | µs / tick | µs / GPU / tick | calls / tick | µs / call |\n|---|---:|---:|---:|---:|")
        for p in rec["Parts"]:
            per_tick = p["Seconds"] / ticks * 1e6
            nvml = p["Part"].startswith("nvml.")
            md.append("| %s | %.1f | %s | %.2f | %s |" % (
                p["Part"], per_tick, "%.1f" % (per_tick / gpus) if nvml else "", p["Calls"] / ticks,
                "%.1f" % p["MicrosPerCall"] if p.get("MicrosPerCall") is not None else ""))
        md.append("")
    with_gpu, without = (results.get(k, {}) for k in ("with GPU", "without GPU"))
    if "us_per_tick" in with_gpu and "us_per_tick" in without and with_gpu.get("own"):
        gpus = max(with_gpu["own"].get("Gpus", 0), 1)
        nvml = sum(p["Seconds"] for p in with_gpu["own"]["Parts"]
                   if p["Part"].startswith("nvml.") or p["Part"] == "sampler.gpu")
        md.append("Per GPU and tick: %.0f µs from outside ((with − without) ÷ %d GPU%s), %.0f µs by the agent's own "
                  "account (its nvml.* parts and sampler.gpu over all its ticks, start-up included); the goal is 100.\n"
                  % ((with_gpu["us_per_tick"] - without["us_per_tick"]) / gpus, gpus, "s" * (gpus != 1),
                     nvml / max(with_gpu["own"]["Ticks"], 1) / gpus * 1e6))


def part_agent(ctx, md):
    md.append("## Agent CPU per tick, idle machine, 100 ms, %.0f s (with and without the GPU, side by side)\n" % AGENT_S)
    if left() < AGENT_S + 20:
        md.append("skipped: %.0f s left" % left())
        return
    results = {}
    missing = os.path.join(ctx["tmp"], "no-libnvidia-ml.so.1")
    threads = [threading.Thread(target=measure_agent, args=(ctx, "with GPU", None, AGENT_S, results)),
               threading.Thread(target=measure_agent, args=(ctx, "without GPU", missing, AGENT_S, results))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=AGENT_S + 90)
    labels = ["with GPU", "without GPU"]
    # GPU_CHECK_BASE_BIN: another build (say, the last release) with the GPU, after the two above
    # (not beside them: two agents on one GPU would share the driver's locks), for a before/after.
    base = os.environ.get("GPU_CHECK_BASE_BIN")
    if base and os.access(base, os.X_OK) and left() > AGENT_S + 20:
        measure_agent(ctx, "with GPU, GPU_CHECK_BASE_BIN", None, AGENT_S, results, binary=base)
        labels.append("with GPU, GPU_CHECK_BASE_BIN")
    md.append("| agent | CPU µs per tick | % of one core | RSS MiB | GPU rows written |\n|---|---:|---:|---:|---:|")
    for label in labels:
        r = results.get(label, {"error": "did not finish"})
        if "error" in r:
            md.append("| %s | error: %s | | | |" % (label, r["error"]))
        else:
            md.append("| %s | %.0f | %.2f | %.1f | %d |" % (label, r["us_per_tick"], r["core_pct"], r["rss_mib"], r["gpu_rows"]))
    md.append("")
    if results.get("with GPU", {}).get("gpu_rows") == 0:
        md.append("note: the agent \"with GPU\" wrote no GPU rows: it found no NVML GPU here, so both rows are without one\n")
    for label in labels:
        for line in results.get(label, {}).get("log", []):
            md.append("* %s: `%s`" % (label, line.strip()))
    md.append("")
    own_table(md, results, labels)


def train(ctx, label, tp, config=None, slow_step=-1, seconds=TRAIN_S, oracle=False):
    """Runs bench/gpu_train.py; returns a dict: times, stderr, out (LocalPath), oracle file, span."""
    tmp = ctx["tmp"]
    steps = os.path.join(tmp, "steps-%s.txt" % label)
    argv = [PY, os.path.join(ROOT, "bench", "gpu_train.py"), "--seconds", str(seconds), "--steps-out", steps]
    if slow_step >= 0:
        argv += ["--slow-step", str(slow_step)]
    env = dict(ctx["env"])
    out = os.path.join(tmp, "run-" + label)
    if tp:
        cfg = os.path.join(tmp, "config-%s.json" % label)
        params = {"LocalPath": out}
        params.update(config or {})
        with open(cfg, "w") as f:
            json.dump({"ProfilingParameters": params}, f)
        argv = [ctx["bin"], "run", "--interval-ms", "100", "--config", cfg, "--local-path", out, "--"] + argv + ["--tp"]
    orc = None
    ofile = os.path.join(tmp, "oracle-%s.txt" % label)
    if oracle and ctx["pynvml"]:
        orc = subprocess.Popen([PY, os.path.abspath(__file__), "--part", "oracle", ofile], env=ctx["env"],
                               stderr=subprocess.DEVNULL)
    t0 = time.time()
    try:
        r = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=min(seconds + 100, max(5, left())))
    finally:
        if orc is not None:
            orc.terminate()
            try:
                orc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                orc.kill()
    t1 = time.time()
    if r.returncode != 0:
        raise RuntimeError("exit %d: %s" % (r.returncode, (r.stdout + r.stderr).strip()[-1200:]))
    with open(steps) as f:
        times = [float(x) for x in f.read().split()]
    return {"times": times, "stderr": r.stderr, "stdout": r.stdout, "out": out, "oracle": ofile if orc else None,
            "span": (t0, t1)}


def part_train(ctx, md):
    md.append("## Training step time: ResNet-50 bf16, batch %s, 6 workers, %.0f s per run\n"
              % (os.environ.get("GPU_CHECK_BATCH", "128"), TRAIN_S))
    if not ctx["torch"]:
        md.append("skipped: %s\n" % ctx["torch_why"])
        return
    rows = []
    runs = {}
    windows = {
        "DetailedProfilingConfig": {"StartStep": 200, "NumSteps": 2},
        "DataloaderProfilingConfig": {"StartStep": 220, "NumSteps": 10},
        "PythonProfilingConfig": {"StartStep": 240, "NumSteps": 3},
        "NativeProfilingConfig": {"StartStep": 260, "NumSteps": 20, "SamplingHz": 99},
        "AutoProfilingConfig": {"StepTimeRatio": 3, "WarmupSteps": 50, "NumSteps": 2,
                                "Features": ["detailed", "python"], "MaxPerHour": 4},
    }
    plan = [("plain", False, None, -1, False), ("trainprof, no window", True, None, -1, True),
            ("trainprof, every window + trigger", True, windows, SLOW_STEP, False)]
    for label, tp, cfg, slow, oracle in plan:
        if left() < TRAIN_S + 30:
            rows.append("| %s | skipped: %.0f s left | | |" % (label, left()))
            continue
        try:
            runs[label] = r = train(ctx, label.split(",")[0].replace(" ", "-") + str(len(runs)), tp, cfg, slow,
                                    oracle=oracle)
            t = r["times"]
            rows.append("| %s | %d | %.2f | %.2f |" % (label, len(t), median_ms(t[50:]),
                                                       1e3 * sorted(t[50:])[int(len(t[50:]) * 0.9)] if len(t) > 60 else float("nan")))
        except Exception as e:
            rows.append("| %s | error: %s | | |" % (label, str(e).replace("\n", " ")[:600]))
    md.append("| run | steps | median ms (after step 50) | p90 ms |\n|---|---:|---:|---:|")
    md.extend(rows)
    md.append("")

    md.append("## GPU utilisation: the agent against nvidia-ml-py over the same run\n")
    r = runs.get("trainprof, no window")
    if r is None or not r.get("oracle"):
        md.append("skipped: %s\n" % ("no pynvml" if not ctx["pynvml"] else "the run did not complete"))
    else:
        try:
            agent = [(x["Timestamp"], x["Value"]) for x in system_rows(r["out"])
                     if x.get("Type") == "gpu" and x.get("Name") == "gpu0" and x.get("Dimension") == "GPUUtilization"]
            with open(r["oracle"]) as f:
                orc = [tuple(map(float, line.split())) for line in f if len(line.split()) == 2]
            if not agent or not orc:
                raise RuntimeError("%d agent rows, %d oracle samples" % (len(agent), len(orc)))
            lo = max(agent[0][0], orc[0][0])
            hi = min(agent[-1][0], orc[-1][0])
            a = [v for t, v in agent if lo <= t <= hi]
            o = [v for t, v in orc if lo <= t <= hi]
            md.append("| source | samples | mean % |\n|---|---:|---:|")
            md.append("| trainprof (gpu0 GPUUtilization) | %d | %.1f |" % (len(a), statistics.mean(a)))
            md.append("| nvidia-ml-py nvmlDeviceGetUtilizationRates every 100 ms | %d | %.1f |" % (len(o), statistics.mean(o)))
            md.append("\nover %.1f s where both ran; difference %.1f points\n" % (hi - lo, statistics.mean(a) - statistics.mean(o)))
        except Exception as e:
            md.append("error: %s: %s\n" % (type(e).__name__, e))

    md.append("## The trigger and the steps after the windows\n")
    r = runs.get("trainprof, every window + trigger")
    if r is None:
        md.append("skipped: the run did not complete\n")
        return
    fired = [int(m.group(1)) for m in re.finditer(r"auto profiling: step (\d+) took", r["stderr"])]
    ok = fired == [SLOW_STEP]
    md.append("* planted slow step %d; triggers fired at %s: **%s**" % (SLOW_STEP, fired or "none",
                                                                           "PASS" if ok else "FAIL"))
    for line in r["stderr"].splitlines():
        if "auto profiling:" in line:
            md.append("  * `%s`" % line.strip())
    t = r["times"]
    ranges = [("before the windows (50-199)", 50, 200), ("after the windows (300-329)", 300, 330),
              ("after the trigger's window (340-end)", 340, len(t))]
    md.append("")
    md.append("| steps | count | median ms |\n|---|---:|---:|")
    for label, a, b in ranges:
        md.append("| %s | %d | %.2f |" % (label, len(t[a:b]), median_ms(t[a:b])))
    plain = runs.get("plain")
    if plain:
        md.append("| plain run, same ranges (50-199 / 300-end) | | %.2f / %.2f |"
                  % (median_ms(plain["times"][50:200]), median_ms(plain["times"][300:])))
    md.append("")
    if len(t) <= SLOW_STEP:
        md.append("(the run ended at step %d, before the planted slow step: raise GPU_CHECK_TRAIN_SECONDS)\n" % len(t))


def part_windows(ctx, md):
    """Which kind of window leaves step time behind: one loop per kind on the same machine
    (only when GPU_CHECK_PARTS names it: with the default parts it would not fit 5 minutes)."""
    md.append("## Steps after each kind of window (medians, ms; %.0f s a run)\n" % TRAIN_S)
    if not ctx["torch"]:
        md.append("skipped: %s\n" % ctx["torch_why"])
        return
    detailed = {"DetailedProfilingConfig": {"StartStep": 200, "NumSteps": 2}}
    plan = [("plain", False, None, {}),
            ("detailed 200-201, TEARDOWN_CUPTI=0 (CUPTI left attached)", True, detailed, {"TEARDOWN_CUPTI": "0"}),
            ("detailed 200-201", True, detailed, {}),
            ("dataloader 220-229 + python 240-242", True,
             {"DataloaderProfilingConfig": {"StartStep": 220, "NumSteps": 10},
              "PythonProfilingConfig": {"StartStep": 240, "NumSteps": 3}}, {}),
            ("native 260-279, 99 Hz", True,
             {"NativeProfilingConfig": {"StartStep": 260, "NumSteps": 20, "SamplingHz": 99}}, {})]
    md.append("| run | steps | 50-199 | 300-399 | 400-end |\n|---|---:|---:|---:|---:|")
    for i, (label, tp, cfg, extra) in enumerate(plan):
        if left() < TRAIN_S + 30:
            md.append("| %s | skipped: %.0f s left | | | |" % (label, left()))
            continue
        sub = dict(ctx, env=dict(ctx["env"], **extra))
        try:
            t = train(sub, "windows%d" % i, tp, cfg)["times"]
            md.append("| %s | %d | %.2f | %.2f | %.2f |" % (label, len(t), median_ms(t[50:200]), median_ms(t[300:400]),
                                                          median_ms(t[400:])))
        except Exception as e:
            md.append("| %s | error: %s | | | |" % (label, str(e).replace("\n", " ")[:600]))
    md.append("")


def part_job(ctx, md):
    """One job with every window, its report's detailed figures, and its files packed (a fixture)."""
    md.append("## One job with every window, and its report (%.0f s)\n" % TRAIN_S)
    if not ctx["torch"]:
        md.append("skipped: %s\n" % ctx["torch_why"])
        return
    cfg = {"DetailedProfilingConfig": {"StartStep": 200, "NumSteps": 2},
           "DataloaderProfilingConfig": {"StartStep": 220, "NumSteps": 10},
           "PythonProfilingConfig": {"StartStep": 240, "NumSteps": 3, "ProfilerName": "cprofile"},
           "NativeProfilingConfig": {"StartStep": 260, "NumSteps": 20, "SamplingHz": 99}}
    r = train(ctx, "job", True, cfg)
    md.append("* %d steps, median %.2f ms" % (len(r["times"]), median_ms(r["times"][50:])))
    # The kernels' extra args, as written (the first timeline that has gpu_functions events).
    seen = {"kernels": 0, "stream": 0, "correlation": 0, "cpu_thread_start_time": 0}
    for path in sorted(glob.glob(os.path.join(r["out"], "framework", "pevents", "*", "*.json"))):
        try:
            with open(path) as f:
                events = json.load(f)
        except (OSError, ValueError):
            continue
        events = [e for e in events if isinstance(e, dict)] if isinstance(events, list) else []
        gpu_pids = {e.get("pid") for e in events if e.get("ph") == "M" and isinstance(e.get("args"), dict)
                    and str(e["args"].get("name", "")).startswith("gpu_functions")}
        for e in events:
            if e.get("ph") != "X" or not isinstance(e.get("args"), dict):
                continue
            if e.get("pid") in gpu_pids:
                seen["kernels"] += 1
                for k in ("stream", "correlation", "cpu_thread_start_time"):
                    seen[k] += k in e["args"]
    md.append("* kernel events: %(kernels)d; with a stream arg %(stream)d, a correlation arg %(correlation)d, "
              "a launch time (cpu_thread_start_time) %(cpu_thread_start_time)d" % seen)
    rep = subprocess.run([ctx["bin"], "report", r["out"], "--json"], capture_output=True, text=True,
                         timeout=max(5, min(120, left())))
    if rep.returncode != 0:
        md.append("* report: exit %d: %s" % (rep.returncode, rep.stderr.strip()[-600:]))
    else:
        model = json.loads(rep.stdout)
        detailed = model.get("detailed")
        md.append("* report's `detailed` (JSON, cut at 6,000 characters):\n\n```\n%s\n```"
                  % json.dumps(detailed, indent=1)[:6000])
    out = os.environ.get("OUT")
    if out:
        packed = os.path.join(out, "job")
        shutil.make_archive(packed, "gztar", r["out"])
        md.append("* packed: job.tar.gz, %d bytes" % os.path.getsize(packed + ".tar.gz"))
    md.append("")


def part_nccl(ctx, md):
    """A one-GPU NCCL job under trainprof with a detailed window: the report's collectives and
    its communication-against-compute figure (docs/report.md, "Communication against compute")."""
    md.append("## One-GPU NCCL job: collectives and communication against compute\n")
    if not ctx["torch"]:
        md.append("skipped: %s\n" % ctx["torch_why"])
        return
    tmp = ctx["tmp"]
    out = os.path.join(tmp, "run-nccl")
    cfg = os.path.join(tmp, "config-nccl.json")
    with open(cfg, "w") as f:
        json.dump({"ProfilingParameters": {"LocalPath": out,
                                           "DetailedProfilingConfig": {"StartStep": 20, "NumSteps": 5}}}, f)
    env = dict(ctx["env"])
    for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(k, None)
    argv = [ctx["bin"], "run", "--config", cfg, "--local-path", out, "--no-report", "--",
            PY, os.path.join(ROOT, "bench", "gpu_nccl.py"), "--steps", "40", "--store", os.path.join(tmp, "nccl-store")]
    r = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=max(5, min(180, left())))
    if r.returncode != 0:
        raise RuntimeError("exit %d: %s" % (r.returncode, (r.stdout + r.stderr).strip()[-1200:]))
    rep = subprocess.run([ctx["bin"], "report", out, "--json"], capture_output=True, text=True,
                         timeout=max(5, min(120, left())))
    if rep.returncode != 0:
        raise RuntimeError("report: exit %d: %s" % (rep.returncode, rep.stderr.strip()[-600:]))
    model = json.loads(rep.stdout)
    c = model.get("collectives")
    if not c:
        raise RuntimeError("the report has no collectives (detailed: %s)"
                           % json.dumps((model.get("detailed") or {}).get("total"))[:1500])
    md.append("* collectives: %d records on %d rank(s), %d NCCL kernels; matched %d (one rank: none expected)"
              % (c["records"], c["ranks"], c["kernels"], c["matched"]))
    total = (model.get("detailed") or {}).get("total") or {}
    comm = next((s for s in total.get("classes", []) if s.get("name") == "communication"), None)
    md.append("* detailed total: %s communication kernels, %s ms"
              % (comm.get("count") if comm else 0, comm.get("ms") if comm else 0))
    o = total.get("comm_overlap")
    if o is None:
        md.append("* comm_overlap: null: no communication kernel in the window (NCCL's one-rank path may "
                  "launch none; c10d's records above are still read)")
    else:
        md.append("* comm_overlap: communication %.3f ms, overlapped by compute %.3f ms (%.1f %%)"
                  % (o["comm_ms"], o["overlapped_ms"], o["pct"]))
        per = [(w["rank"], (w.get("comm_overlap") or {}).get("pct")) for w in model["detailed"]["windows"]]
        md.append("* per window: %s" % ", ".join("%s %s" % (rk, "–" if p is None else "%.1f %%" % p) for rk, p in per))
    md.append("* sentence: %s" % total.get("sentence", "")[:600])
    md.append("")


def part_memory(ctx, md):
    """A ResNet with a planted leak and then a planted out-of-memory error (bench/gpu_memory.py)
    under trainprof with a memory window and `OomSnapshot`: one snapshot for the window and
    exactly one at the error, the trainer's exit status unchanged, and what the report reads
    from them (docs/report.md, "Snapshot keys"; the GPUMemoryLeak finding)."""
    md.append("## Memory snapshots: a planted leak, then a planted out-of-memory error\n")
    if not ctx["torch"]:
        md.append("skipped: %s\n" % ctx["torch_why"])
        return
    tmp = ctx["tmp"]
    out = os.path.join(tmp, "run-memory")
    cfg = os.path.join(tmp, "config-memory.json")
    with open(cfg, "w") as f:
        json.dump({"ProfilingParameters": {
            "LocalPath": out,
            "MemoryProfilingConfig": json.dumps({"StartStep": 10, "NumSteps": 8, "OomSnapshot": True}),
            "HangDetectionConfig": json.dumps({"HangTimeoutS": 300})}}, f)
    argv = [ctx["bin"], "run", "--config", cfg, "--local-path", out, "--no-report", "--",
            PY, os.path.join(ROOT, "bench", "gpu_memory.py"), "--steps", "40", "--oom-step", "30"]
    t0 = time.monotonic()
    r = subprocess.run(argv, capture_output=True, text=True, env=ctx["env"], timeout=max(5, min(240, left())))
    wall = time.monotonic() - t0
    plain = subprocess.run(argv[argv.index("--") + 1:], capture_output=True, text=True, env=ctx["env"],
                           timeout=max(5, min(240, left())))
    md.append("* exit status under trainprof %d, without %d (the same: %s); %.0f s"
              % (r.returncode, plain.returncode, "yes" if r.returncode == plain.returncode else "NO", wall))
    files = []
    for dirpath, _, names in os.walk(os.path.join(out, "framework", "memory")):
        files += [os.path.join(dirpath, n) for n in names]
    windows = [f for f in files if os.path.basename(f).startswith("window-")]
    ooms = [f for f in files if os.path.basename(f).startswith("oom-")]
    md.append("* snapshots: %d of the window (%s), %d at the error (%s): %s"
              % (len(windows), ", ".join("%s %d bytes" % (os.path.basename(f), os.path.getsize(f)) for f in windows),
                 len(ooms), ", ".join(os.path.basename(f) for f in ooms),
                 "as expected" if len(windows) == 1 and len(ooms) == 1 else "NOT one each"))
    named = "memory snapshot at the out-of-memory error" in (r.stderr + r.stdout)
    # The dump folder's traceback text (docs/formats.md, "Hang and crash dumps"): any small
    # text file under framework/ that is no snapshot.
    for dirpath, _, names in os.walk(os.path.join(out, "framework")):
        for n in names:
            path = os.path.join(dirpath, n)
            if n.endswith(".pickle") or os.path.getsize(path) > (1 << 20):
                continue
            try:
                with open(path, errors="replace") as f:
                    named = named or "memory snapshot at the out-of-memory error" in f.read()
            except OSError:
                pass
    md.append("* the flight recorder's exception dump names the snapshot: %s" % ("yes" if named else "no"))
    rep = subprocess.run([ctx["bin"], "report", out, "--json"], capture_output=True, text=True,
                         timeout=max(5, min(120, left())))
    if rep.returncode != 0:
        raise RuntimeError("report: exit %d: %s" % (rep.returncode, rep.stderr.strip()[-600:]))
    model = json.loads(rep.stdout)
    for s in (model.get("memory") or {}).get("snapshots", []):
        for d in s.get("devices", []):
            top = "; ".join("%s:%s %s %d bytes ×%d" % (t["file"], t["line"], t["function"], t["bytes"], t["count"])
                            for t in d.get("top", [])[:3])
            leak = (d.get("leak") or {}).get("sentence") or ("judged, none" if d.get("leak_judged") else "not judged")
            agent = d.get("agent") or {}
            md.append("* %s %s steps %s–%s, %s: %d entries, peak allocated %d, reserved %d; top: %s; leak: %s; "
                      "the agent's trainer memory %s" % (
                          s["kind"], s["node"], s.get("first_step"), s.get("last_step"), d["device"], d["entries"],
                          d["peak_allocated_bytes"], d["peak_reserved_bytes"], top, leak,
                          agent.get("trainer_bytes", "not compared")))
    leak = next((f for f in model.get("findings", []) if f.get("rule") == "GPUMemoryLeak"), None)
    md.append("* GPUMemoryLeak: %s" % (json.dumps(leak)[:800] if leak else "absent"))
    md.append("")


def probe_torch(env):
    code = "import torch, torchvision; print(torch.__version__, torchvision.__version__, torch.cuda.is_available(), " \
           "torch.cuda.get_device_name(0) if torch.cuda.is_available() else '')"
    try:
        r = subprocess.run([PY, "-c", code], capture_output=True, text=True, timeout=120, env=env)
    except subprocess.TimeoutExpired:
        return False, "importing torch took over 120 s"
    if r.returncode != 0:
        return False, "no torch/torchvision for %s (%s)" % (PY, (r.stderr.strip().splitlines() or ["?"])[-1])
    parts = r.stdout.split()
    if len(parts) < 3 or parts[2] != "True":
        return False, "torch %s sees no CUDA device" % (parts[0] if parts else "?")
    return True, "torch %s, torchvision %s, %s" % (parts[0], parts[1], " ".join(parts[3:]))


def main():
    if len(sys.argv) >= 3 and sys.argv[1] == "--part":
        if sys.argv[2] == "nvml":
            return nvml_part()
        if sys.argv[2] == "oracle":
            return oracle_part(sys.argv[3])
    tmp = tempfile.mkdtemp(prefix="gpu-check-")
    md = ["# trainprof gpu-check\n"]
    ctx = {"tmp": tmp, "env": base_env(tmp), "bin": find_bin()}
    try:
        import pynvml  # noqa: F401

        ctx["pynvml"] = True
    except ImportError:
        ctx["pynvml"] = False
    ctx["torch"], ctx["torch_why"] = probe_torch(ctx["env"])
    cores = os.cpu_count()
    md.append("* host: %d cores, python %s; %s; nvidia-ml-py: %s" % (
        cores, sys.version.split()[0], ctx["torch_why"], "yes" if ctx["pynvml"] else "no"))
    md.append("* trainprof: %s; NVML library: %s\n" % (ctx["bin"] or "not found (set TRAINPROF_BIN)",
                                                      os.environ.get("TRAINPROF_NVML_LIB", "libnvidia-ml.so.1")))
    parts = [("nvml", part_nvml, False), ("agent", part_agent, True), ("train", part_train, True),
             ("windows", part_windows, True), ("job", part_job, True), ("nccl", part_nccl, True),
             ("memory", part_memory, True)]
    # GPU_CHECK_PARTS: a comma list of the parts to run (by default nvml, agent and train), for
    # a second run that only repeats what changed, or the windows part.
    only = [p for p in os.environ.get("GPU_CHECK_PARTS", "nvml,agent,train").split(",") if p]
    for name, fn, needs_bin in parts:
        t0 = time.monotonic()
        if name not in only:
            md.append("## %s\n\nskipped: not in GPU_CHECK_PARTS\n" % name)
            continue
        if needs_bin and not ctx["bin"]:
            md.append("## %s\n\nskipped: no trainprof binary\n" % name)
            continue
        try:
            fn(ctx, md)
        except Exception as e:
            md.append("\n**%s failed**: %s: %s\n" % (name, type(e).__name__, str(e)[:1500]))
        md.append("_%s: %.0f s_\n" % (name, time.monotonic() - t0))
    md.append("_total: %.0f s_" % (time.monotonic() - START))
    text = "\n".join(md) + "\n"
    sys.stdout.write(text)
    out = os.environ.get("OUT")
    if out:
        try:
            with open(os.path.join(out, "gpu-check.md"), "w") as f:
                f.write(text)
        except OSError as e:
            print("cannot write %s/gpu-check.md: %s" % (out, e), file=sys.stderr)
    if os.environ.get("GPU_CHECK_KEEP") != "1":
        shutil.rmtree(tmp, ignore_errors=True)
    else:
        print("kept: %s" % tmp, file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
