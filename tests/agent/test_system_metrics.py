"""`trainprof run` around a CPU-burning command, read back by smdebug 1.0.34's
LocalSystemMetricsReader (the compatibility oracle for system metrics files, docs/formats.md).

The GPU rows come from a fake libnvidia-ml.so.1 built here with cc from the agent's test
source (agent/tests/c/fake_nvml.c): two GPUs, gpu1 without power readings. Everything
else is this machine's real /proc and cgroup files.
"""

import os
import pathlib
import statistics
import subprocess
import sys
import time

import pytest
from smdebug.profiler.system_metrics_reader import LocalSystemMetricsReader

ROOT = pathlib.Path(__file__).resolve().parents[2]

BURN = """
import sys, time
t = time.time()
while time.time() - t < 3.0:
    pass
sys.exit(4)
"""

# (Type, Name prefix or exact Name, Dimension) that must be there: smdebug's vocabulary,
# then trainprof's own (docs/formats.md, "System metrics: vocabulary").
REQUIRED = [
    ("cpu", "cpu", "CPUUtilization"),
    ("cpu", "cpu", "I/OWaitPercentage"),
    ("gpu", "gpu", "GPUUtilization"),
    ("gpu", "gpu", "GPUMemoryUtilization"),
    ("memory", "MemoryUsedPercent", ""),
    ("i/o", "IOPS", ""),
    ("i/o", "ReadThroughputInBytesPerSecond", ""),
    ("i/o", "WriteThroughputInBytesPerSecond", ""),
    ("network", "ReceiveBytesPerSecond", "Algorithm"),
    ("network", "TransmitBytesPerSecond", "Algorithm"),
    ("trainer", "CPUPercent", "ProcessTree"),
    ("trainer", "RSSBytes", "ProcessTree"),
    ("host", "AllCores", "BusyPercent"),
    ("host", "AllCores", "IOWaitPercent"),
    ("accelerator", "device", "PowerWatts"),
    ("accelerator", "device", "MemUsedBytes"),
]


def online_cores():
    with open("/proc/stat") as f:
        return sorted(
            int(line.split()[0][3:]) for line in f if line.startswith("cpu") and line[3].isdigit()
        )


@pytest.fixture(scope="module")
def burned(trainprof_bin, fake_nvml, tmp_path_factory):
    """One `trainprof run` of the burn script; (returncode, stderr, events, root)."""
    root = tmp_path_factory.mktemp("run") / "profiler"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TRAINPROF_", "SMPROFILER_"))}
    env["TRAINPROF_NVML_LIB"] = str(fake_nvml)
    env["TRAINPROF_RESOURCE_CONFIG"] = str(root / "no-resourceconfig.json")
    env["SMPROFILER_CONFIG_PATH"] = str(root / "no-profilerconfig.json")
    t0 = time.time()
    proc = subprocess.run(
        [str(trainprof_bin), "run", "--interval-ms", "100", "--local-path", str(root), "--",
         sys.executable, "-c", BURN],
        env=env, capture_output=True, text=True, timeout=120,
    )
    t1 = time.time()
    reader = LocalSystemMetricsReader(str(root))
    # File names are window starts (whole minutes): ask from well before the run.
    events = reader.get_events(int((t0 - 120) * 1e6), int((t1 + 1) * 1e6))
    return proc.returncode, proc.stderr, events, root


def test_exit_status_is_passed_through(burned):
    code, stderr, _, _ = burned
    assert code == 4, stderr


def test_every_type_and_dimension_and_all_cores(burned):
    _, stderr, events, _ = burned
    assert events, stderr
    seen = {(e.type, e.name, e.dimension) for e in events}
    for kind, name, dim in REQUIRED:
        assert any(t == kind and n.startswith(name) and d == dim for t, n, d in seen), (kind, name, dim, stderr)
    for core in online_cores():
        assert ("cpu", f"cpu{core}", "CPUUtilization") in seen
        assert ("cpu", f"cpu{core}", "I/OWaitPercentage") in seen
    assert {n for t, n, d in seen if t == "gpu"} == {"gpu0", "gpu1"}
    # Bytes of the cgroup's limit when there is one, else of the host's memory.
    assert {("ram", "MemoryUsedBytes"), ("ram", "MemoryLimitBytes")} <= {
        (t, n) for t, n, d in seen if d in ("host", "cgroup")}
    # The fake gpu1 does not support power: switched off for it alone.
    assert ("accelerator", "device0", "PowerWatts") in seen
    assert ("accelerator", "device1", "PowerWatts") not in seen
    assert all(e.node_id == "algo-1" for e in events)


def test_about_thirty_ticks_each_with_one_timestamp(burned):
    _, _, events, _ = burned
    stamps = sorted({e.timestamp for e in events})
    # 3 s at 100 ms, plus the interpreter's start-up and the last tick at the end; a
    # loaded machine may skip a few (skipped ticks are counted, never queued).
    assert 20 <= len(stamps) <= 40, len(stamps)
    gaps = [b - a for a, b in zip(stamps, stamps[1:])]
    assert statistics.median(gaps) == pytest.approx(0.1, abs=0.02)
    # Deadlines do not drift: each tick is close to start + k * 100 ms.
    phase = [((t - stamps[0]) * 10) % 1 for t in stamps[1:-1]]
    assert statistics.median(min(p, 1 - p) for p in phase) < 0.2, phase
    # Every tick carries the per-core rows of all cores under one timestamp.
    per_tick = {}
    for e in events:
        if e.type == "cpu" and e.name.startswith("cpu") and e.dimension == "CPUUtilization":
            per_tick.setdefault(e.timestamp, set()).add(e.name)
    assert all(len(names) == len(online_cores()) for names in per_tick.values())


def test_values_in_range_and_the_busy_core_is_busy(burned):
    _, _, events, _ = burned
    for e in events:
        assert isinstance(e.value, (int, float)), e.__dict__
        assert e.value >= 0, e.__dict__
        if e.dimension in ("CPUUtilization", "I/OWaitPercentage", "GPUUtilization", "GPUMemoryUtilization") \
                or e.name == "MemoryUsedPercent":
            assert e.value <= 100, e.__dict__
    busiest = {}
    for e in events:
        if e.type == "cpu" and e.name.startswith("cpu") and e.dimension == "CPUUtilization":
            busiest[e.timestamp] = max(busiest.get(e.timestamp, 0), e.value)
    # The burning thread keeps one core (nearly) full; it may move between cores
    # within a tick, and a loaded CI machine shares the cores, so ask for "half busy"
    # most of the time, and an idle machine would not pass.
    busy_ticks = sum(1 for v in busiest.values() if v >= 50)
    assert busy_ticks >= 0.6 * len(busiest), sorted(busiest.items())
    trainer = [e.value for e in events if e.type == "trainer" and e.name == "CPUPercent"]
    assert statistics.median(trainer) >= 40, trainer


def test_sealed_files_and_end_markers(burned):
    _, stderr, _, root = burned
    assert (root / "system" / "training_job_end.ts").is_file()
    assert (root / "framework" / "training_job_end.ts").is_file()
    names = [p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file()]
    assert not [n for n in names if n.endswith(".tmp")], names
    assert "files: " in stderr and " system" in stderr, stderr


def test_run_around_a_trainer_that_uses_the_package(trainprof_bin, tmp_path):
    """`trainprof run` hands the trainer the hook library next to the binary: the trainer's
    timelines and the system files land side by side, and the summary counts both."""
    lib = trainprof_bin.parent / "libtrainprof_hook.so"
    if not lib.is_file():
        pytest.fail(f"{lib} missing: build the hook (`cargo build -p trainprof-hook`; scripts/test does)")
    out = tmp_path / "out"
    config = tmp_path / "profilerconfig.json"
    config.write_text('{"ProfilingParameters": {"LocalPath": "%s"}}' % out)
    seen = tmp_path / "hook_lib_seen"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TRAINPROF_", "SMPROFILER_"))}
    env["PYTHONPATH"] = str(ROOT / "hook-ffi" / "python")
    env["TRAINPROF_RESOURCE_CONFIG"] = str(tmp_path / "no-resourceconfig.json")
    env["TRAINPROF_TEST_MANIFEST"] = str(tmp_path / "manifest.json")
    env["TRAINPROF_TEST_PARAMS"] = '{"phases": [["train", 5]], "work_ms": 20}'
    loop = ROOT / "tests" / "hook" / "scripts" / "loop.py"
    script = f'printf %s "$TRAINPROF_HOOK_LIB" > {seen} && exec {sys.executable} {loop}'
    proc = subprocess.run(
        [str(trainprof_bin), "run", "--config", str(config), "--interval-ms", "100", "--", "sh", "-c", script],
        env=env, capture_output=True, text=True, timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert pathlib.Path(seen.read_text()).resolve() == lib.resolve()
    timelines = list((out / "framework" / "pevents").rglob("*_pythontimeline.json"))
    system = list((out / "system" / "incremental").rglob("*.algo-1.json"))
    assert timelines and system, proc.stderr
    assert f"files: {len(system)} system, {len(timelines)} timeline" in proc.stderr, proc.stderr
