"""The GPU rows of a real `trainprof run` over the fake libnvidia-ml.so.1
(agent/tests/c/fake_nvml.c, built here with cc), read back by smdebug 1.0.34's
LocalSystemMetricsReader: the sample buffers' mean and max, throttle reasons, PCIe / NVLink /
energy / ECC fields, GPM, Xid and ECC events, and the trainer's processes on the GPU
(docs/formats.md, "GPU").

The fake's gpu0 answers everything; gpu1 lacks the sample buffers, power, NVLink, GPM,
per-process utilisation and events, so those rows are switched off for gpu1 alone. The fake
lists the pids the trainer writes to FAKE_NVML_PIDS_FILE as its GPU processes, plus one pid
that is nobody's (4194000).
"""

import os
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
# The fake's GPU buffer, three new samples per tick from {50,100,80,90}: the possible means.
GPU_MEANS = {(50 + 100 + 80) / 3, (90 + 50 + 100) / 3, (80 + 90 + 50) / 3, (100 + 80 + 90) / 3}


def host_pid_namespace():
    return os.readlink("/proc/self/ns/pid") == "pid:[4026531836]"


@pytest.fixture(scope="module")
def run(trainprof_bin, fake_nvml, tmp_path_factory):
    """One `trainprof run` of the trainer: (stderr, rows by (type, name, dimension) in tick
    order, the trainer's pid)."""
    d = tmp_path_factory.mktemp("gpu")
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
    rows = {}
    for e in sorted(events, key=lambda e: e.timestamp):
        rows.setdefault((e.type, e.name, e.dimension), []).append(e.value)
    assert rows, proc.stderr
    return proc.stderr, rows, int(pids.read_text())


def values(rows, name, dimension, kind="accelerator"):
    return rows.get((kind, name, dimension), [])


def test_utilisation_is_the_intervals_mean_and_max(run):
    stderr, rows, _ = run
    means = values(rows, "gpu0", "GPUUtilization", "gpu")
    assert len(means) >= 10, stderr
    # Each tick's mean of its own three samples (written to two decimals), never the instant
    # reading (87).
    assert all(any(abs(v - m) < 0.006 for m in GPU_MEANS) for v in means), means
    assert set(values(rows, "device0", "BusyMaxPercent")) <= {90, 100}
    assert set(values(rows, "device0", "MemoryBusyMaxPercent")) <= {40, 50, 60}
    # gpu1 has no buffer: the instant reading, and no max.
    assert set(values(rows, "gpu1", "GPUUtilization", "gpu")) == {3}
    assert not values(rows, "device1", "BusyMaxPercent")


def test_throttle_fields_and_gpm(run):
    stderr, rows, _ = run
    assert set(values(rows, "device0", "ThrottleReasonsMask")) == {0x44}
    assert set(values(rows, "device0", "ThrottleSwPowerCap")) == {1}
    assert set(values(rows, "device0", "ThrottleHwThermal")) == {1}
    assert not values(rows, "device0", "ThrottleGpuIdle")
    assert set(values(rows, "device1", "ThrottleReasonsMask")) == {0}
    for dim in ("PcieTxBytesPerSecond", "PcieRxBytesPerSecond", "NvlinkTxBytesPerSecond",
                "NvlinkRxBytesPerSecond", "EnergyMeanWatts"):
        v = values(rows, "device0", dim)
        assert v and all(x > 0 for x in v), (dim, v, stderr)
    # One call per tick: the counters grow by a fixed step per tick, so the rates follow the
    # tick's length (100 ms): about 10 MB/s of PCIe TX and 212.5 W from the energy counter.
    assert sorted(values(rows, "device0", "PcieTxBytesPerSecond"))[len(values(rows, "device0", "PcieTxBytesPerSecond")) // 2] == \
        pytest.approx(1e7, rel=0.3)
    assert set(values(rows, "device0", "PowerInstantWatts")) == {215}
    assert set(values(rows, "device0", "EccCorrectedVolatile")) == {2}
    assert set(values(rows, "device0", "EccUncorrectedAggregate")) == {1}
    assert set(values(rows, "device0", "SmActivePercent")) == {61.5}
    assert set(values(rows, "device0", "SmOccupancyPercent")) == {33.25}
    assert set(values(rows, "device0", "TensorActivePercent")) == {44}
    assert set(values(rows, "device0", "DramActivePercent")) == {12.5}
    # gpu1: PCIe only; the rest switched off for it alone, one line each.
    assert values(rows, "device1", "PcieRxBytesPerSecond")
    for dim in ("NvlinkTxBytesPerSecond", "PowerInstantWatts", "EnergyMeanWatts", "EccCorrectedVolatile",
                "SmActivePercent", "XidEvents"):
        assert not values(rows, "device1", dim), dim
    assert stderr.count("gpu1: NvlinkTxBytesPerSecond switched off") == 1, stderr
    assert stderr.count("gpu1: the GPM metrics switched off") == 1, stderr


def test_an_xid_event_is_logged_once_and_counted(run):
    stderr, rows, _ = run
    assert stderr.count("gpu0: Xid 79") == 1, stderr
    assert stderr.count("gpu0: single-bit ECC error event") == 1, stderr
    xid = values(rows, "device0", "XidEvents")
    assert xid and set(xid) == {1}, xid
    sbe = values(rows, "device0", "EccSingleBitEvents")
    assert sbe[0] in (0, 1) and sbe[-1] == 1 and sorted(sbe) == sbe, sbe
    assert set(values(rows, "device0", "EccDoubleBitEvents")) == {0}


def test_the_gpus_processes_follow_the_pid_namespace(run):
    stderr, rows, _ = run
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


# The tree sampler publishes the tree's pids (agent/src/sample/tree_pids.rs); the GPU sampler
# attributes the fake's processes to them.
def test_the_trainer_is_attributed(run):
    stderr, rows, trainer = run
    # The first ticks may come before the trainer wrote its pid or the tree saw it, the last
    # after it exited: some tick in between has it.
    assert 1 in values(rows, "device0", "TrainerProcesses"), stderr
    assert trainer in values(rows, "device0", "TopProcess1Pid")
    assert (1 << 30) in values(rows, "device0", "TopProcess1MemUsedBytes")
    assert (1 << 30) in values(rows, "device0", "TrainerMemUsedBytes")
    # The fake's first listed pid: SM 70 and 50 in a tick's two periods.
    assert 60 in values(rows, "device0", "TopProcess1SmBusyPercent")
    assert 60 in values(rows, "device0", "TrainerSmBusyPercent")
    assert max(values(rows, "device0", "TrainerProcesses")) == 1
