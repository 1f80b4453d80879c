"""The GPU rows of a real `trainprof run` over the fake libnvidia-ml.so.1
(agent/tests/c/fake_nvml.c, built here with cc), read back by smdebug 1.0.34's
LocalSystemMetricsReader: the sample buffers' mean and max, throttle reasons, PCIe / NVLink /
energy / ECC fields, GPM, Xid and ECC events, and the trainer's processes on the GPU
(docs/formats.md, "GPU").

The fake's gpu0 answers everything; gpu1 lacks the sample buffers, power, NVLink, GPM,
per-process utilisation and events, so those rows are switched off for gpu1 alone. The fake
lists the pids the trainer writes to FAKE_NVML_PIDS_FILE as its GPU processes, plus one pid
that is nobody's (4194000).

Each kind of query has its cadence (docs/formats.md, "GPU: cadence"): the fake here holds
2.4 s of samples (25, one each 100 ms), so its buffers are read every 1.8 s; the counters
(60 s) only on the first and the last tick of this 2.5 s run.
"""

import ctypes
import os
import pathlib
import shutil
import subprocess
import sys
import time

import pytest
from smdebug.profiler.system_metrics_reader import LocalSystemMetricsReader

TRAINER = """
import os, sys, time
with open(sys.argv[1], "w") as f:
    f.write(str(os.getpid()))
t = time.time()
while time.time() - t < 2.5:
    time.sleep(0.01)
"""

FOREIGN_PID = 4194000
# The fake's GPU buffer cycles through these; its instant reading is the newest of them.
GPU_SAMPLES = {50, 100, 80, 90}
FAKE_C = pathlib.Path(__file__).resolve().parents[2] / "agent" / "tests" / "c" / "fake_nvml.c"


def build_fake(out_dir, *defines):
    cc = shutil.which("cc")
    if cc is None:
        pytest.fail("no C compiler (cc) on PATH")
    out = out_dir / "libnvidia-ml.so.1"
    subprocess.run([cc, "-shared", "-fPIC", "-O2", *defines, "-o", str(out), str(FAKE_C)], check=True)
    return out


def host_pid_namespace():
    return os.readlink("/proc/self/ns/pid") == "pid:[4026531836]"


@pytest.fixture(scope="module")
def run(trainprof_bin, tmp_path_factory):
    """One `trainprof run` of the trainer: (stderr, rows by (type, name, dimension) in tick
    order, the trainer's pid, the rows' timestamps by the same key)."""
    d = tmp_path_factory.mktemp("gpu")
    fake_nvml = build_fake(d, "-DFAKE_NVML_SAMPLE_US=100000", "-DFAKE_NVML_RING=25")
    root = d / "profiler"
    pids = d / "pids"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TRAINPROF_", "SMPROFILER_", "FAKE_NVML_"))}
    env["TRAINPROF_NVML_LIB"] = str(fake_nvml)
    env["FAKE_NVML_PIDS_FILE"] = str(pids)
    env["TRAINPROF_RESOURCE_CONFIG"] = str(root / "no-resourceconfig.json")
    env["SMPROFILER_CONFIG_PATH"] = str(root / "no-profilerconfig.json")
    t0 = time.time()
    proc = subprocess.run(
        [str(trainprof_bin), "run", "--interval-ms", "100", "--local-path", str(root), "--",
         sys.executable, "-c", TRAINER, str(pids)],
        env=env, capture_output=True, text=True, timeout=120,
    )
    t1 = time.time()
    assert proc.returncode == 0, proc.stderr
    events = LocalSystemMetricsReader(str(root)).get_events(int((t0 - 120) * 1e6), int((t1 + 1) * 1e6))
    rows, times = {}, {}
    for e in sorted(events, key=lambda e: e.timestamp):
        rows.setdefault((e.type, e.name, e.dimension), []).append(e.value)
        times.setdefault((e.type, e.name, e.dimension), []).append(e.timestamp)
    assert rows, proc.stderr
    return proc.stderr, rows, int(pids.read_text()), times


def values(rows, name, dimension, kind="accelerator"):
    return rows.get((kind, name, dimension), [])


def stamps(times, name, dimension, kind="accelerator"):
    """The timestamps (s) of a dimension's rows."""
    return times.get((kind, name, dimension), [])


def test_utilisation_every_tick_and_the_buffers_at_their_cadence(run):
    stderr, rows, _, times = run
    util = values(rows, "gpu0", "GPUUtilization", "gpu")
    assert len(util) >= 15, stderr
    # NVML's newest sample every tick (a mean of several only where the buffers were read on
    # two ticks in a row).
    assert all(50 <= v <= 100 for v in util), util
    assert sum(v in GPU_SAMPLES for v in util) >= 0.9 * len(util), util
    assert len(values(rows, "gpu0", "GPUMemoryUtilization", "gpu")) == len(util)
    # The buffers: three quarters of the 2.4 s they hold, so a row every 1.8 s or so (and on
    # the last tick); each the mean and max over the samples since the previous read.
    assert "gpu0: sample buffers read every 1.8 s (they hold 2.4 s)" in stderr, stderr
    assert "fell out of the utilisation buffer" not in stderr, stderr
    means = values(rows, "device0", "BusyMeanPercent")
    assert 3 <= len(means) < len(util) / 3, means
    read = stamps(times, "device0", "BusyMeanPercent")
    # 1.8 s apart at most (less a tick: the last tick before it passed; the first ones are
    # spread over the GPUs, the last one is the stop's).
    assert all(b - a <= 1.85 for a, b in zip(read, read[1:])), read
    assert all(50 <= v <= 100 for v in means), means
    assert set(values(rows, "device0", "BusyMaxPercent")[1:]) <= {90, 100}
    assert set(values(rows, "device0", "MemoryBusyMaxPercent")[1:]) <= {40, 50, 60}
    assert len(values(rows, "device0", "MemoryBusyMeanPercent")) == len(means)
    # gpu1 has no buffer: the instant reading, and no max.
    assert set(values(rows, "gpu1", "GPUUtilization", "gpu")) == {3}
    assert not values(rows, "device1", "BusyMaxPercent")


def test_throttle_fields_and_gpm(run):
    stderr, rows, _, times = run
    ticks = len(values(rows, "gpu0", "GPUUtilization", "gpu"))
    assert set(values(rows, "device0", "ThrottleReasonsMask")) == {0x44}
    assert set(values(rows, "device0", "ThrottleSwPowerCap")) == {1}
    assert set(values(rows, "device0", "ThrottleHwThermal")) == {1}
    assert not values(rows, "device0", "ThrottleGpuIdle")
    assert set(values(rows, "device1", "ThrottleReasonsMask")) == {0}
    assert values(rows, "device0", "PowerInstantWatts") == [215] * ticks
    # The counters are read on the first tick and (the run being shorter than their 60 s) the
    # last: one rate each, the counter's growth over exactly the time between the two reads
    # (the fake's counters grow by one step per read: 1 MB of PCIe TX, 21.25 J).
    first, last = stamps(times, "device0", "EccCorrectedVolatile")
    assert values(rows, "device0", "EccCorrectedVolatile") == [2, 2]
    assert values(rows, "device0", "EccUncorrectedAggregate") == [1, 1]
    for dim, step in (("PcieTxBytesPerSecond", 1e6), ("PcieRxBytesPerSecond", 2e6),
                      ("NvlinkTxBytesPerSecond", 1000 * 1024), ("NvlinkRxBytesPerSecond", 3000 * 1024),
                      ("EnergyMeanWatts", 21.25)):
        v = values(rows, "device0", dim)
        assert len(v) == 1 and stamps(times, "device0", dim) == [last], (dim, v, stderr)
        assert v[0] == pytest.approx(step / (last - first), rel=0.01), (dim, v, last - first)
    assert values(rows, "device0", "SmActivePercent") == [61.5]
    assert values(rows, "device0", "SmOccupancyPercent") == [33.25]
    assert values(rows, "device0", "TensorActivePercent") == [44]
    assert values(rows, "device0", "DramActivePercent") == [12.5]
    # gpu1: PCIe only; the rest switched off for it alone, one line each.
    assert len(values(rows, "device1", "PcieRxBytesPerSecond")) == 1
    for dim in ("NvlinkTxBytesPerSecond", "PowerInstantWatts", "EnergyMeanWatts", "EccCorrectedVolatile",
                "SmActivePercent", "XidEvents"):
        assert not values(rows, "device1", dim), dim
    assert stderr.count("gpu1: NvlinkTxBytesPerSecond switched off") == 1, stderr
    assert stderr.count("gpu1: the GPM metrics switched off") == 1, stderr


def test_an_xid_event_is_logged_once_and_counted(run):
    stderr, rows, _, _ = run
    assert stderr.count("gpu0: Xid 79") == 1, stderr
    assert stderr.count("gpu0: single-bit ECC error event") == 1, stderr
    xid = values(rows, "device0", "XidEvents")
    assert xid and set(xid) == {1}, xid
    sbe = values(rows, "device0", "EccSingleBitEvents")
    assert sbe[0] in (0, 1) and sbe[-1] == 1 and sorted(sbe) == sbe, sbe
    assert set(values(rows, "device0", "EccDoubleBitEvents")) == {0}


def test_the_gpus_processes_follow_the_pid_namespace(run):
    stderr, rows, _, _ = run
    assert values(rows, "device0", "TrainerProcesses"), stderr
    assert values(rows, "device0", "TrainerMemUsedBytes")
    assert values(rows, "device1", "TrainerProcesses")
    assert not values(rows, "device1", "TrainerSmBusyPercent"), "per-process utilisation off on gpu1"
    unattributed = values(rows, "device0", "UnattributedProcesses")
    if host_pid_namespace():
        # The foreign pid is known not to be ours: left out.
        assert not unattributed
    else:
        assert unattributed and set(unattributed) == {1}, unattributed
        assert set(values(rows, "device0", "UnattributedMemUsedBytes")) == {512 << 20}


# The tree sampler publishes the tree's pids (agent/src/pipeline/sample/tree_pids.rs); the GPU sampler
# attributes the fake's processes to them.
def test_the_trainer_is_attributed(run):
    stderr, rows, trainer, _ = run
    # The first ticks may come before the trainer wrote its pid or the tree saw it, the last
    # after it exited: some tick in between has it.
    assert 1 in values(rows, "device0", "TrainerProcesses"), stderr
    assert trainer in values(rows, "device0", "TopProcess1Pid")
    assert (1 << 30) in values(rows, "device0", "TopProcess1MemUsedBytes")
    assert (1 << 30) in values(rows, "device0", "TrainerMemUsedBytes")
    # The fake's first listed pid: SM 60, read with the buffers (not every tick).
    assert 60 in values(rows, "device0", "TopProcess1SmBusyPercent")
    assert 60 in values(rows, "device0", "TrainerSmBusyPercent")
    assert len(values(rows, "device0", "TrainerSmBusyPercent")) <= len(values(rows, "device0", "BusyMeanPercent"))
    assert max(values(rows, "device0", "TrainerProcesses")) == 1


COST_PROBE = """
import ctypes, sys, time
lib = ctypes.CDLL(sys.argv[1])
assert lib.nvmlInit_v2() == 0
dev = ctypes.c_void_p()
assert lib.nvmlDeviceGetHandleByIndex_v2(0, ctypes.byref(dev)) == 0
def cpu(call):
    t = time.thread_time_ns()
    call()
    return (time.thread_time_ns() - t) / 1e3
count, vtype = ctypes.c_uint(0), ctypes.c_int(0)
buf = (ctypes.c_ubyte * (16 * 256))()
def samples():
    count.value = 256
    assert lib.nvmlDeviceGetSamples(dev, 1, ctypes.c_ulonglong(0), ctypes.byref(vtype), ctypes.byref(count), buf) == 0
# nvmlFieldValue_t: fieldId, scopeId, timestamp, latencyUsec, valueType, nvmlReturn, value (40 bytes)
fields = (ctypes.c_ubyte * (40 * 3))()
def batch(*wanted):
    for i, f in enumerate(wanted):
        ctypes.c_uint.from_buffer(fields, 40 * i).value = f
    assert lib.nvmlDeviceGetFieldValues(dev, len(wanted), fields) == 0
temp = ctypes.c_uint()
print(cpu(samples), cpu(lambda: batch(83)), cpu(lambda: batch(83, 197, 3)),
      cpu(lambda: lib.nvmlDeviceGetTemperature(dev, 0, ctypes.byref(temp))), count.value)
"""


def test_the_fake_spends_its_cost_table(tmp_path):
    """FAKE_NVML_COST_US: each call spends its cost in CPU time (at least: measured with the
    thread's CPU clock), a field batch the sum of its fields'; a function not listed costs
    nothing extra. The buffer holds the ring it was built with."""
    lib = build_fake(tmp_path, "-DFAKE_NVML_RING=30")
    env = dict(os.environ, FAKE_NVML_COST_US="nvmlDeviceGetSamples=3000,nvmlDeviceGetFieldValues:83=5000,"
                                             "nvmlDeviceGetFieldValues:197=2000")
    out = subprocess.run([sys.executable, "-c", COST_PROBE, str(lib)], env=env, capture_output=True,
                         text=True, timeout=60, check=True).stdout.split()
    samples, energy, batch, temperature, held = map(float, out)
    assert samples >= 3000 and energy >= 5000 and batch >= 7000, out
    assert temperature < 2000, out
    assert held == 30, out


def test_the_node_record_names_each_gpu_s_model_for_compare_and_the_page(trainprof_bin, fake_nvml, tmp_path):
    """The GPU models NVML gives (the fake's "Fake GPU A" and "Fake GPU B") are written once
    per node, in `system/node/<node>/<µs>.json` (docs/formats.md, "Node record"), beside
    system files smdebug still reads; `report` and `compare` name them."""
    import json
    root = tmp_path / "profiler"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TRAINPROF_", "SMPROFILER_", "FAKE_NVML_"))}
    env["TRAINPROF_NVML_LIB"] = str(fake_nvml)
    env["TRAINPROF_RESOURCE_CONFIG"] = str(tmp_path / "no-resourceconfig.json")
    env["SMPROFILER_CONFIG_PATH"] = str(tmp_path / "no-profilerconfig.json")
    # The job's identity (docs/formats.md, "Job identity") under SLURM, with a hostile job
    # name: it stays text in the record, the page and --json.
    for k in [k for k in env if k.startswith(("SLURM", "KUBERNETES_", "TRAINING_JOB", "PET_"))] + \
            ["RANK", "LOCAL_RANK", "WORLD_SIZE", "TORCHELASTIC_RUN_ID", "SM_CURRENT_HOST"]:
        env.pop(k, None)
    hostile = '4242"</script><b>\n' + "x" * 10_000
    env.update(SLURM_JOB_ID=hostile, SLURM_PROCID="3", SLURM_NTASKS="8", CUDA_VISIBLE_DEVICES="1,0")
    t0 = time.time()
    proc = subprocess.run([str(trainprof_bin), "run", "--interval-ms", "100", "--local-path", str(root), "--",
                           "sleep", "0.5"], env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    [record] = (root / "system" / "node" / "algo-1").iterdir()
    assert record.name.endswith(".json") and len(record.name) == len("1795316901523417.json"), record
    doc = json.loads(record.read_text())
    assert doc["NodeId"] == "algo-1" and t0 - 1 < doc["Timestamp"] < time.time(), doc
    assert doc["Gpus"] == [
        {"Index": 0, "Model": "Fake GPU A", "MemoryTotalBytes": 16 << 30, "Uuid": "GPU-00000000-0000-0000-0000-00000000000a"},
        {"Index": 1, "Model": "Fake GPU B", "MemoryTotalBytes": 8 << 30, "Uuid": "GPU-00000000-0000-0000-0000-00000000000b"},
    ], doc
    job = doc["Job"]
    assert job["Platforms"] == ["slurm"], job
    assert job["Variables"]["SLURM_JOB_ID"] == hostile[:256], job
    assert job["Variables"]["SLURM_PROCID"] == "3" and job["Variables"]["CUDA_VISIBLE_DEVICES"] == "1,0", job
    # smdebug's reader lists only the system files, and reads every one of them.
    events = LocalSystemMetricsReader(str(root)).get_events(int((t0 - 120) * 1e6), int((time.time() + 1) * 1e6))
    assert {(e.type, e.name, e.dimension) for e in events} >= {("gpu", "gpu0", "GPUUtilization")}
    assert all(e.node_id == "algo-1" for e in events)

    report = subprocess.run([str(trainprof_bin), "report", str(root), "--json"], capture_output=True, text=True,
                            timeout=120)
    assert report.returncode == 0, report.stderr
    assert json.loads(report.stdout)["job"]["gpu_models"] == {"algo-1": {"Fake GPU A": 1, "Fake GPU B": 1}}
    ident = json.loads(report.stdout)["job"]["identities"]["algo-1"]
    assert ident["job"] == '4242"</script><b>\\x0a' + "x" * (128 - 21) + "…", ident
    assert (ident["rank"], ident["world_size"], ident["gpus"], ident["gpu_model"]) == \
        ("3", "8", "2", "Fake GPU A,Fake GPU B"), ident
    page = (root / "report.html").read_text()
    assert "<th>GPUs (node records)</th><td>algo-1: 1 × Fake GPU A, 1 × Fake GPU B</td>" in page
    assert "<th>Job identity (node records)</th><td>algo-1: platform slurm, job 4242&quot;&lt;/script&gt;&lt;b&gt;" in page
    assert "</script><b>" not in page
    compare = subprocess.run([str(trainprof_bin), "compare", str(root), str(root), "--json"], capture_output=True,
                             text=True, timeout=120)
    # No step in either run (exit 2), but the comparability list is printed.
    assert compare.returncode == 2, compare.stderr
    items = {i["what"]: i for i in json.loads(compare.stdout)["comparable"]["items"]}
    assert items["GPU model"] == {"what": "GPU model", "a": "1 × Fake GPU A, 1 × Fake GPU B",
                                  "b": "1 × Fake GPU A, 1 × Fake GPU B", "status": "same", "note": ""}, items
    assert items["platform (job identity)"]["a"] == "slurm", items
