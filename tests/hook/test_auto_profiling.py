"""Anomaly-triggered windows (``AutoProfilingConfig``, docs/formats.md, "Anomaly-triggered
windows"): a real Python trainer loading the real library, steps of a set length
(time.sleep), the timeline read back from the sealed files (and by smdebug 1.0.34's reader,
which must still read them), the Python-stats folders from disk.

The steps sleep 20 ms and a slow one 200 ms (10x); StepTimeRatio is 5 rather than the
default 3 so that a loaded machine stretching a 20 ms sleep does not trigger on its own.
"""

import json
import os
import subprocess

import pytest
from smdebug.profiler.algorithm_metrics_reader import LocalAlgorithmMetricsReader
from smdebug.profiler.profiler_config_parser import MetricsCategory, ProfilerConfigParser

TRIGGER = "trainprof:AutoProfilingTrigger"
PHASE = "trainprof:AutoProfiling"


def auto(**settings):
    base = {"StepTimeRatio": 5, "WarmupSteps": 20, "NumSteps": 2, "Features": ["detailed", "python"]}
    base.update(settings)
    return {"AutoProfilingConfig": base}


def timeline(out):
    """Every object of every sealed timeline file, in file order."""
    root = out / "framework" / "pevents"
    files = sorted(p for p in root.rglob("*") if p.is_file())
    assert files, "no sealed timeline"
    objs = []
    for p in files:
        doc = json.loads(p.read_text())
        assert isinstance(doc, list)
        objs.extend(doc)
    return objs


def triggers(out):
    return [e for e in timeline(out) if e.get("name") == TRIGGER]


def python_windows(out, framework="pytorch"):
    """Window folder names without their times, e.g. ``train-31-stepstart_train-31-forwardpassend``."""
    root = out / "framework" / framework / "cprofile"
    if not root.exists():
        return set()
    (node,) = os.listdir(root)
    names = set()
    for name in os.listdir(root / node):
        assert os.path.isfile(root / node / name / "python_stats"), name
        names.add("_".join(h.rsplit("-", 1)[0] for h in name.split("_")))
    return names


def opened(manifest, what):
    return [s["step"] for s in manifest["steps"] if s[what]]


@pytest.mark.parametrize("framework", ["pytorch", "tensorflow"])
def test_a_slow_step_opens_detailed_and_python_at_the_next_steps(run_script, framework):
    params = {"steps": 40, "slow": {"30": 200}, "framework": framework}
    run = run_script("auto_steps.py", params, config=auto()).check()
    m = run.manifest
    assert m["init_status"] == 0
    assert opened(m, "detailed") == [31, 32]
    assert opened(m, "python") == [31, 32]
    # Cut where the framework cuts (docs/formats.md, "Window sequence"); no pre-step-zero or
    # post-close window: PythonProfilingConfig is not configured.
    cut = "forwardpassend" if framework == "pytorch" else "stepend"
    assert python_windows(run.out, framework) == {
        f"train-31-stepstart_train-31-{cut}",
        f"train-31-{cut}_train-32-stepstart",
        f"train-32-stepstart_train-32-{cut}",
        f"train-32-{cut}_train-33-stepstart",
    }

    (t,) = triggers(run.out)
    objs = timeline(run.out)
    base = objs[0]["args"]["start_time_since_epoch_in_micros"]
    assert t["ph"] == "i" and t["s"] == "g"
    args = t["args"]
    assert args["step"] == 30 and args["step_num"] == "30"
    assert 200 <= args["duration_ms"] < 1000, args
    assert 20 <= args["median_ms"] < 40, args
    assert args["features"] == ["detailed", "python"]
    assert (args["window_start_step"], args["window_num_steps"]) == (31, 2)
    assert args["pid"] == m["pid"]
    # At the slow step's end: the end of its step event.
    step30 = next(e for e in objs if e.get("name") == "Step:ModeKeys.TRAIN" and e["args"]["step_num"] == "30")
    assert t["ts"] == step30["ts"] + step30["dur"]
    pids = {o["args"]["name"]: o["pid"] for o in objs if o.get("name") == "process_name" and o["pid"] != 0}
    assert pids[PHASE] == t["pid"]
    # One log line.
    lines = [line for line in run.proc.stderr.splitlines() if "auto profiling:" in line]
    assert len(lines) == 1 and "step 30 took" in lines[0] and "detailed, python for steps 31..=32" in lines[0], lines

    # smdebug's reader still reads every file: all 40 steps, the instant event ignored.
    events = LocalAlgorithmMetricsReader(trace_root_folder=str(run.out)).get_events(0, 10**18)
    steps = sorted(int(e.event_args["step_num"]) for e in events if e.event_phase == "Step:ModeKeys.TRAIN")
    assert steps == list(range(40))
    assert not any(e.event_name == TRIGGER for e in events)


def test_a_slow_step_inside_the_window_does_not_trigger_again(run_script):
    # 30 triggers; 31 and 32 (its window) are slow too; 33 is fast; 36 triggers again.
    slow = {"30": 200, "31": 200, "32": 200, "36": 200}
    run = run_script("auto_steps.py", {"steps": 40, "slow": slow}, config=auto(MaxPerHour=10)).check()
    assert [t["args"]["step"] for t in triggers(run.out)] == [30, 36]
    assert opened(run.manifest, "detailed") == [31, 32, 37, 38]
    # The window's slow steps stayed out of the median.
    assert all(t["args"]["median_ms"] < 40 for t in triggers(run.out))


@pytest.mark.parametrize("configured", [False, True])
def test_a_windows_close_is_not_a_slow_step(run_script, configured):
    """Closing a detailed window costs 20x the median step, in the step after the window
    (where torch.profiler's stop lands): it must not trigger, nor its window's close the
    next, until MaxPerHour is spent; the real slow step at 50 triggers."""
    config = auto(Features=["detailed"], MaxPerHour=4)
    slow = {"50": 200}
    if configured:
        config["DetailedProfilingConfig"] = {"StartStep": 25, "NumSteps": 2}
    else:
        slow["30"] = 200
    run = run_script("auto_steps.py", {"steps": 60, "slow": slow, "close_ms": 400}, config=config).check()
    want = [50] if configured else [30, 50]
    assert [t["args"]["step"] for t in triggers(run.out)] == want
    windows = [25, 26] if configured else [31, 32]
    assert opened(run.manifest, "detailed") == windows + [51, 52]
    # The closes stayed out of the median.
    assert all(t["args"]["median_ms"] < 40 for t in triggers(run.out))


def test_max_per_hour_holds(run_script):
    slow = {str(s): 200 for s in range(5, 60, 5)}  # 11 slow steps, each outside a window
    run = run_script(
        "auto_steps.py",
        {"steps": 60, "slow": slow},
        config=auto(WarmupSteps=3, NumSteps=1, MaxPerHour=3, Features=["detailed"]),
    ).check()
    got = triggers(run.out)
    assert [t["args"]["step"] for t in got] == [5, 10, 15]
    assert opened(run.manifest, "detailed") == [6, 11, 16]
    assert opened(run.manifest, "python") == [], "python is not named"
    assert python_windows(run.out) == set()
    assert len([line for line in run.proc.stderr.splitlines() if "auto profiling:" in line]) == 3


def test_warm_up_steps_never_trigger(run_script):
    run = run_script("auto_steps.py", {"steps": 30, "slow": {"10": 200, "25": 200}}, config=auto()).check()
    assert [t["args"]["step"] for t in triggers(run.out)] == [25]
    assert opened(run.manifest, "detailed") == [26, 27]


def test_without_the_config_nothing_triggers(run_script):
    run = run_script("auto_steps.py", {"steps": 30, "slow": {"25": 200}}, config={}).check()
    assert triggers(run.out) == []
    assert opened(run.manifest, "detailed") == []


def test_a_bad_value_turns_off_only_this_feature(run_script):
    config = auto(StepTimeRatio=0.5)
    config["DetailedProfilingConfig"] = {"StartStep": 3, "NumSteps": 1}
    run = run_script("auto_steps.py", {"steps": 30, "slow": {"25": 200}}, config=config).check()
    assert triggers(run.out) == []
    assert opened(run.manifest, "detailed") == [3]
    assert any("AutoProfilingConfig.StepTimeRatio: 0.5 is not above 1" in line for line in run.proc.stderr.splitlines())


def test_smdebug_ignores_the_extension(tmp_path, monkeypatch, trainprof_bin):
    """smdebug 1.0.34's own parser reads a config with AutoProfilingConfig as if it were not
    there (the same windows); `trainprof config check` shows the extension in words."""
    def write(with_auto):
        params = {"LocalPath": str(tmp_path / "out"), "DetailedProfilingConfig": '{"StartStep": 5, "NumSteps": 2}'}
        if with_auto:
            params["AutoProfilingConfig"] = json.dumps(auto()["AutoProfilingConfig"])
        path = tmp_path / f"config-{with_auto}.json"
        path.write_text(json.dumps({"ProfilingParameters": params}))
        return path

    def smdebug_steps(path):
        monkeypatch.setenv("SMPROFILER_CONFIG_PATH", str(path))
        parser = ProfilerConfigParser()
        assert parser.profiling_enabled
        return [s for s in range(20) if parser.should_save_metrics(MetricsCategory.DETAILED_PROFILING, s)]

    assert smdebug_steps(write(True)) == smdebug_steps(write(False)) == [5, 6]

    proc = subprocess.run(
        [str(trainprof_bin), "config", "check", str(write(True))],
        capture_output=True,
        text=True,
        check=True,
        env={"PATH": "/usr/bin:/bin"},
    )
    assert (
        "auto profiling: after 20 warm-up train steps, a train step longer than 5 × the median of the last "
        "50 train steps outside windows opens detailed, python for the next 2 steps (at most 4 a rolling hour)"
    ) in proc.stdout.splitlines()
    assert "problems: none" in proc.stdout.splitlines()
