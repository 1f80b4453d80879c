"""Running `trainprof run` around a script and reading its system rows back with smdebug's
LocalSystemMetricsReader, for the trainer-tree and pressure tests."""

import os
import subprocess
import sys
import time
from collections import defaultdict

from smdebug.profiler.system_metrics_reader import LocalSystemMetricsReader


def run_agent(trainprof_bin, tmp_path, argv, interval_ms=100, timeout=180):
    """(completed process, events) of `trainprof run -- argv` writing under tmp_path."""
    root = tmp_path / "profiler"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TRAINPROF_", "SMPROFILER_"))}
    env["TRAINPROF_NVML_LIB"] = str(tmp_path / "no-libnvidia-ml.so.1")
    env["TRAINPROF_RESOURCE_CONFIG"] = str(tmp_path / "no-resourceconfig.json")
    env["SMPROFILER_CONFIG_PATH"] = str(tmp_path / "no-profilerconfig.json")
    t0 = time.time()
    proc = subprocess.run(
        [str(trainprof_bin), "run", "--interval-ms", str(interval_ms), "--local-path", str(root), "--", *argv],
        env=env, capture_output=True, text=True, timeout=timeout,
    )
    t1 = time.time()
    events = LocalSystemMetricsReader(str(root)).get_events(int((t0 - 120) * 1e6), int((t1 + 1) * 1e6))
    return proc, events


def python(script):
    return [sys.executable, "-c", script]


def by_tick(events, kind):
    """{timestamp: {(name, dimension): value}} of the rows of Type `kind`."""
    ticks = defaultdict(dict)
    for e in events:
        if e.type == kind:
            ticks[e.timestamp][(e.name, e.dimension)] = e.value
    return dict(sorted(ticks.items()))
