"""Pressure stalls and the clock error bound as `trainprof run` writes them
(docs/formats.md, "Pressure stalls" and "Clock error bound"), from this machine's real
files and the real adjtimex, read back with smdebug 1.0.34's LocalSystemMetricsReader."""

import os
import pathlib

import pytest
from tree_support import by_tick, python, run_agent

# Two threads of busy Python for 1.5 s: the GIL makes them wait on each other, and on a
# loaded machine for a core.
BURN = r"""
import threading, time
def burn():
    t = time.time()
    while time.time() - t < 1.5:
        pass
ts = [threading.Thread(target=burn) for _ in range(2)]
[t.start() for t in ts]
[t.join() for t in ts]
"""


@pytest.fixture(scope="module")
def run(trainprof_bin, tmp_path_factory):
    return run_agent(trainprof_bin, tmp_path_factory.mktemp("pressure"), python(BURN))


def readable(path):
    try:
        pathlib.Path(path).read_bytes()
        return True
    except OSError:
        return False


def own_cgroup_has_psi():
    """Whether this process's cgroup v2 directory has a cpu.pressure file."""
    try:
        line = next(l for l in open("/proc/self/cgroup") if l.startswith("0::"))
    except (OSError, StopIteration):
        return False
    if not os.path.exists("/sys/fs/cgroup/cgroup.controllers"):
        return False
    return readable(os.path.join("/sys/fs/cgroup", line[3:].strip().lstrip("/"), "cpu.pressure"))


def test_pressure_rows_from_the_real_files(run):
    proc, events = run
    assert proc.returncode == 0, proc.stderr
    if not (readable("/proc/pressure/cpu") or own_cgroup_has_psi()):
        pytest.skip("no pressure stall information here: /proc/pressure/cpu is not readable "
                    "(a kernel without CONFIG_PSI or booted with psi=0) and no cgroup v2 cpu.pressure")
    ticks = by_tick(events, "pressure")
    assert len(ticks) >= 10, proc.stderr
    names = {key for t in ticks.values() for key in t}
    for resource in ("CPU", "Memory", "IO"):
        if readable(f"/proc/pressure/{resource.lower()}") or own_cgroup_has_psi():
            assert (resource, "SomeStalledPercent") in names, names
    assert ("Memory", "FullStalledPercent") in names, names
    for t in ticks.values():
        for (name, dim), v in t.items():
            assert dim in ("SomeStalledPercent", "FullStalledPercent"), (name, dim)
            assert 0 <= v <= 100, (name, dim, v)
            if dim == "FullStalledPercent" and (name, "SomeStalledPercent") in t:
                # Every task stalled implies some task stalled.
                assert v <= t[(name, "SomeStalledPercent")] + 0.01, t
    sampling = [l for l in proc.stderr.splitlines() if l.startswith("trainprof: sampling every")]
    assert sampling and "pressure" in sampling[0], proc.stderr
    assert any(l.startswith("trainprof: pressure stalls from ") for l in proc.stderr.splitlines()), proc.stderr


def test_clock_rows_once_at_the_start(run):
    proc, events = run
    ticks = by_tick(events, "clock")
    # Once a minute and on the first tick: a run of a few seconds has one reading.
    assert len(ticks) == 1, (ticks, proc.stderr)
    (rows,) = ticks.values()
    assert rows[("Synchronised", "Kernel")] in (0, 1), rows
    assert rows[("MaxErrorMicros", "Kernel")] >= 0, rows
    assert rows[("EstimatedErrorMicros", "Kernel")] >= 0, rows
    if rows[("Synchronised", "Kernel")] == 1:
        # A synchronised clock's bound is below the kernel's 16 s ceiling.
        assert rows[("MaxErrorMicros", "Kernel")] < 16_000_000, rows
