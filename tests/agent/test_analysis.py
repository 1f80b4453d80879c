"""smdebug 1.0.34's analysis stack on a real `trainprof run`: the profiler trial the rules run
on, and `PandasFrameAnalysis`.

One short job (a few seconds inside one clock minute) with a trainer that records steps
through the trainprof package (tests/hook/scripts/loop.py) and two GPUs from the fake
libnvidia-ml.so.1 (agent/tests/c/fake_nvml.c). Then:

* the profiler trial's latest timestamp and its 60 s windows, walked the way the rules walk
  them (`wait_for_data` until `NoMoreProfilerData`, the system and framework readers'
  `get_events(start, end)` per window), hold every tick and every step
  (docs/formats.md, "System files: names");
* `PandasFrameAnalysis.get_utilization_stats` sees only percentages under cpu / gpu /
  memory, and the rules' core count is the machine's (docs/formats.md, "System metrics:
  vocabulary").
"""

import json
import os
import pathlib
import subprocess
import sys
import time

import pytest
from smdebug.exceptions import NoMoreProfilerData
from smdebug.profiler.algorithm_metrics_reader import LocalAlgorithmMetricsReader
from smdebug.profiler.analysis.utils.pandas_data_analysis import PandasFrameAnalysis, Resource
from smdebug.profiler.analysis.utils.profiler_data_to_pandas import PandasFrame
from smdebug.profiler.system_metrics_reader import LocalSystemMetricsReader
from smdebug.trials import profiler_trial

ROOT = pathlib.Path(__file__).resolve().parents[2]
LOOP = ROOT / "tests" / "hook" / "scripts" / "loop.py"
STEPS = 30
WINDOW_US = 60 * 1000 * 1000
# The job must not cross a minute: it starts no later than this second of a minute (the
# run takes about 3 s, plus the interpreter's start on a loaded machine).
LATEST_START_SECOND = 40


def online_cores():
    with open("/proc/stat") as f:
        return {line.split()[0] for line in f if line.startswith("cpu") and line[3].isdigit()}


@pytest.fixture(scope="module")
def job(trainprof_bin, hook_lib, package_dir, fake_nvml, tmp_path_factory):
    """One short `trainprof run` around a trainer recording STEPS steps: (root, manifest,
    start, end) with the wall times around the run."""
    d = tmp_path_factory.mktemp("analysis")
    out = d / "out"
    config = d / "profilerconfig.json"
    config.write_text(json.dumps({"ProfilingParameters": {"LocalPath": str(out)}}))
    manifest = d / "manifest.json"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TRAINPROF_", "SMPROFILER_"))}
    env.update(
        PYTHONPATH=str(package_dir),
        TRAINPROF_HOOK_LIB=str(hook_lib),
        TRAINPROF_NVML_LIB=str(fake_nvml),
        TRAINPROF_RESOURCE_CONFIG=str(d / "no-resourceconfig.json"),
        TRAINPROF_TEST_MANIFEST=str(manifest),
        TRAINPROF_TEST_PARAMS=json.dumps({"phases": [["train", STEPS]], "work_ms": 40, "local_path": str(out)}),
    )
    # Inside one minute: wait for the next one when this one is nearly over.
    second = time.time() % 60
    if second > LATEST_START_SECOND:
        time.sleep(60 - second + 0.5)
    start = time.time()
    proc = subprocess.run(
        [str(trainprof_bin), "run", "--config", str(config), "--interval-ms", "100", "--",
         sys.executable, str(LOOP)],
        env=env, capture_output=True, text=True, timeout=120,
    )
    end = time.time()
    assert proc.returncode == 0, proc.stderr
    assert int(start // 60) == int(end // 60), f"the job crossed a minute: {start} .. {end}"
    return out, json.loads(manifest.read_text()), start, end, proc.stderr


@pytest.fixture
def trial(job, tmp_path, monkeypatch):
    """smdebug's ProfilerTrial on the job. Its constructor sleeps 10 s once even when the
    files are there: the sleep is skipped (the files are checked first, so it cannot spin)."""
    out = job[0]
    assert list((out / "system" / "incremental").rglob("*.json")), "no system files"
    monkeypatch.setattr(profiler_trial.time, "sleep", lambda s: None)
    t = profiler_trial.ProfilerTrial("analysis", str(out), str(tmp_path / "rules"))
    assert t.job_finished()
    return t


def everything(out):
    wide = (0, int((time.time() + 3600) * 1e6))
    system = LocalSystemMetricsReader(str(out)).get_events(*wide)
    framework = LocalAlgorithmMetricsReader(str(out)).get_events(*wide)
    return system, framework


def is_step(e):
    return e.event_phase == "Step:ModeKeys.TRAIN"


def test_the_trial_s_windows_hold_every_tick_and_every_step(job, trial):
    out, manifest, start, end, stderr = job
    system, framework = everything(out)
    ticks = {e.timestamp for e in system}
    steps = {(e.event_args["step_num"], e.start_time, e.end_time) for e in framework if is_step(e)}
    assert len(steps) == STEPS == len(manifest["steps"]), stderr
    assert len(ticks) >= 10, stderr
    last_tick, last_step_end = max(ticks), max(s[2] for s in steps)

    # The newest system file is the last tick's, named by its second.
    names = sorted(p.name for p in (out / "system" / "incremental").rglob("*.algo-1.json"))
    assert len(names) >= 2, names
    assert int(names[-1].split(".")[0]) == int(last_tick), (names, last_tick)

    # The trial's latest timestamp (the older of the newest system and timeline names) is
    # past its first one, and the windows it lets the rules walk reach both ends.
    first, latest = trial.first_timestamp, trial.get_latest_timestamp()
    assert first <= int(min(ticks) * 1e6), (first, min(ticks))
    assert latest > first, (first, latest, names)
    seen_ticks, seen_steps, windows = set(), set(), 0
    t0 = first
    while True:
        t1 = t0 + WINDOW_US
        try:
            trial.wait_for_data(t1, t0)
        except NoMoreProfilerData:
            break
        windows += 1
        seen_ticks |= {e.timestamp for e in trial.get_system_metrics(t0, t1)}
        seen_steps |= {
            (e.event_args["step_num"], e.start_time, e.end_time) for e in trial.get_framework_metrics(t0, t1)
            if is_step(e)
        }
        t0 = t1
        assert windows < 10, "the trial never said there is no more data"
    assert windows >= 1
    assert t0 >= last_tick * 1e6 and t0 >= last_step_end, (t0, last_tick, last_step_end)
    assert seen_ticks == ticks, sorted(ticks - seen_ticks)
    assert seen_steps == steps, sorted(steps - seen_steps)


def test_utilization_stats_are_percentages_and_the_cores_are_the_machine_s(job):
    out, _, _, _, stderr = job
    frame = PandasFrame(str(out))
    system_df = frame.get_all_system_metrics()
    framework_df = frame.get_all_framework_metrics()
    assert not system_df.empty and not framework_df.empty, stderr

    # The rows the analysis takes for cpu / gpu / memory (Type *contains* the word).
    for word in ("cpu", "gpu", "memory"):
        rows = system_df[system_df["type"].str.contains(word)]
        assert not rows.empty, word
        assert rows["value"].between(0, 100).all(), rows[~rows["value"].between(0, 100)].head(10).to_string()
    # Every core once, nothing else, under Type cpu and under the Dimension the rules count.
    cpu_names = set(system_df[system_df["type"].str.contains("cpu")]["system_metric"])
    assert cpu_names == online_cores(), cpu_names
    system, _ = everything(out)
    rule_cores = {e.name for e in system if e.dimension == "CPUUtilization"}
    assert rule_cores == online_cores(), rule_cores
    # The fake NVML's two GPUs, and their watts, °C, MHz and bytes still written elsewhere.
    assert set(system_df[system_df["type"].str.contains("gpu")]["system_metric"]) == {"gpu0", "gpu1"}
    assert {e.dimension for e in system if e.type == "gpu"} == {"GPUUtilization", "GPUMemoryUtilization"}
    extra = {(e.name, e.dimension) for e in system if e.type == "accelerator"}
    assert ("device0", "PowerWatts") in extra and ("device1", "TemperatureCelsius") in extra, extra
    assert any(e.type == "host" and e.dimension == "BusyPercent" for e in system)
    assert any(e.type == "ram" and e.name == "MemoryUsedBytes" for e in system)

    stats = PandasFrameAnalysis(system_df, framework_df).get_utilization_stats()
    by_resource = stats.set_index("Resource")
    for resource in (Resource.CPU, Resource.GPU, Resource.MEMORY):
        row = by_resource.loc[resource.value]
        for column in ("utilization_min", "utilization_max", "utilization_p99", "utilization_mean"):
            assert 0 <= row[column] <= 100, (resource, column, row.to_dict())
