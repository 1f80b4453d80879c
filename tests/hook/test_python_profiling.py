"""Python-profiling windows written by the trainprof package, read back with smdebug
1.0.34's cProfileAnalysis / PyinstrumentAnalysis.

The expected directory names are the ones smdebug 1.0.34 itself produced for the same
config and call sequence (docs/formats.md, "Directory pattern":
PythonProfilingConfig StartStep 2, NumSteps 2, TRAIN steps 0..4), times left out.
"""

import json
import os
import pstats

import pytest
from smdebug.profiler.analysis.python_profile_analysis import PyinstrumentAnalysis, cProfileAnalysis
from smdebug.profiler.analysis.utils.python_profile_analysis_utils import StepPhase
from smdebug.profiler.python_profile_utils import PythonProfileModes

# From smdebug 1.0.34's own output (the listing named in the module docstring).
SMDEBUG_PYTORCH_WINDOWS = {
    "prestepzero-*-start_train-0-stepstart",
    "train-2-stepstart_train-2-forwardpassend",
    "train-2-forwardpassend_train-3-stepstart",
    "train-3-stepstart_train-3-forwardpassend",
    "train-3-forwardpassend_train-4-stepstart",
    "prestepzero-*-end_posthookclose-*-end",
}
SMDEBUG_TENSORFLOW_WINDOWS = {
    "prestepzero-*-start_train-0-stepstart",
    "train-2-stepstart_train-2-stepend",
    "train-2-stepend_train-3-stepstart",
    "train-3-stepstart_train-3-stepend",
    "train-3-stepend_train-4-stepstart",
    "prestepzero-*-end_posthookclose-*-end",
}
WORK_FUNCTIONS = (
    "tp_setup_work",
    "tp_forward_work",
    "tp_backward_work",
    "tp_between_steps_work",
    "tp_teardown_work",
)


def python_config(**python):
    return {"PythonProfilingConfig": python}


def stats_dirs(out, framework, profiler):
    """{window name without times: (directory, start µs, end µs)} of one node; checks
    that there is exactly one node and that the names have smdebug's shape."""
    root = out / "framework" / framework / profiler
    nodes = os.listdir(root)
    assert len(nodes) == 1, nodes
    result = {}
    for name in os.listdir(root / nodes[0]):
        halves = name.split("_")
        assert len(halves) == 2, name
        fields = [h.split("-") for h in halves]
        assert all(len(f) == 4 for f in fields), name
        for f in fields:
            assert "." in f[3] and float(f[3]) > 1.5e15, name  # a Python float str() of epoch µs
        key = "_".join("-".join(f[:3]) for f in fields)
        assert key not in result, name
        result[key] = (root / nodes[0] / name, float(fields[0][3]), float(fields[1][3]))
    return nodes[0], result


def assert_windows_ordered(dirs):
    """Windows do not overlap: each ends before the next starts."""
    spans = sorted((start, end) for _, start, end in dirs.values())
    for (s, e), (next_s, _) in zip(spans, spans[1:]):
        assert s <= e <= next_s, spans
    assert spans[0][0] <= spans[-1][1]


def cprofile_functions(stats):
    assert stats is not None, "no stats for the interval"
    names = [f.function_name for f in stats.function_stats_list]
    return {fn for fn in WORK_FUNCTIONS if any(n.endswith(f"({fn})") for n in names)}


def pyinstrument_functions(stats):
    assert stats is not None, "no stats for the interval"
    found = set()

    def walk(frame):
        if frame is None:
            return
        if frame["function"] in WORK_FUNCTIONS:
            found.add(frame["function"])
        for child in frame.get("children", []):
            walk(child)

    for s in stats:
        walk(s.json_stats["root_frame"])
    return found


def test_cprofile_windows_pytorch(run_script):
    run = run_script(
        "loop.py",
        {"phases": [["train", 5]], "events": False, "work_ms": 2},
        config=python_config(StartStep=2, NumSteps=2, ProfilerName="cProfile", cProfileTimer="total_time"),
    ).check()
    node, dirs = stats_dirs(run.out, "pytorch", "cprofile")
    assert node == run.manifest["node_id"]
    assert set(dirs) == SMDEBUG_PYTORCH_WINDOWS
    assert_windows_ordered(dirs)
    for path, _, _ in dirs.values():
        assert os.listdir(path) == ["python_stats"], path
        assert pstats.Stats(str(path / "python_stats")).stats  # marshal data pstats reads
    assert not (run.out / "framework" / "pytorch" / "pyinstrument").exists()

    analysis = cProfileAnalysis(local_profile_dir=str(run.out / "framework" / "pytorch" / "cprofile"))
    df = analysis.list_profile_stats()
    assert df.shape[0] == len(SMDEBUG_PYTORCH_WINDOWS)
    assert set(df["framework"]) == {"pytorch"} and set(df["node_id"]) == {node}
    # The hook's own cost (docs/formats.md, "The hook's own cost"): every window opened by the
    # close (the post-close one too) and closed but the post-close one, which ends at exit.
    [record] = (run.out / "framework" / "cost" / node).glob("*.json")
    parts = {p["Part"]: p for p in json.loads(record.read_text())["Parts"]}
    assert parts["window.python.open"]["Calls"] == len(SMDEBUG_PYTORCH_WINDOWS), parts
    assert parts["window.python.close"]["Calls"] == len(SMDEBUG_PYTORCH_WINDOWS) - 1, parts
    assert parts["window.python.close"]["Seconds"] > 0, parts

    assert cprofile_functions(analysis.fetch_pre_step_zero_profile_stats()) == {"tp_setup_work"}
    forward = analysis.fetch_profile_stats_by_step(2, end_phase=StepPhase.FORWARD_PASS_END)
    assert cprofile_functions(forward) == {"tp_forward_work"}
    after_forward = analysis.fetch_profile_stats_by_step(
        2, 3, start_phase=StepPhase.FORWARD_PASS_END, end_phase=StepPhase.STEP_START
    )
    assert cprofile_functions(after_forward) == {"tp_backward_work", "tp_between_steps_work"}
    assert cprofile_functions(analysis.fetch_post_hook_close_profile_stats()) == {"tp_teardown_work"}
    # Steps outside the window were not profiled.
    assert analysis.fetch_profile_stats_by_step(1, end_phase=StepPhase.FORWARD_PASS_END) is None
    assert analysis.fetch_profile_stats_by_step(4, end_phase=StepPhase.FORWARD_PASS_END) is None
    # The post-close window starts as "prestepzero" (as smdebug names it), ends as "posthookclose".
    post = analysis.fetch_profile_stats_between_modes(
        PythonProfileModes.PRE_STEP_ZERO, PythonProfileModes.POST_HOOK_CLOSE
    )
    assert cprofile_functions(post) == {"tp_teardown_work"}
    train = analysis.fetch_profile_stats_between_modes(PythonProfileModes.TRAIN, PythonProfileModes.TRAIN)
    assert cprofile_functions(train) == {"tp_forward_work", "tp_backward_work", "tp_between_steps_work"}


def test_pyinstrument_windows_pytorch(run_script):
    pytest.importorskip("pyinstrument")
    run = run_script(
        "loop.py",
        {"phases": [["train", 5]], "events": False, "work_ms": 15},
        config=python_config(StartStep=2, NumSteps=2, ProfilerName="Pyinstrument"),
    ).check()
    assert run.warnings() == [], run.proc.stderr  # no message from the package
    node, dirs = stats_dirs(run.out, "pytorch", "pyinstrument")
    assert set(dirs) == SMDEBUG_PYTORCH_WINDOWS
    assert_windows_ordered(dirs)
    for path, _, _ in dirs.values():
        assert sorted(os.listdir(path)) == ["python_stats.html", "python_stats.json"], path
        doc = json.loads((path / "python_stats.json").read_text())
        assert {"start_time", "duration", "sample_count", "root_frame"} <= set(doc), path
        assert doc["root_frame"] is not None, path
        assert "<html" in (path / "python_stats.html").read_text().lower()
    assert not (run.out / "framework" / "pytorch" / "cprofile").exists()

    analysis = PyinstrumentAnalysis(local_profile_dir=str(run.out / "framework" / "pytorch" / "pyinstrument"))
    assert analysis.list_profile_stats().shape[0] == 2 * len(SMDEBUG_PYTORCH_WINDOWS)  # .json and .html
    assert pyinstrument_functions(analysis.fetch_pre_step_zero_profile_stats()) == {"tp_setup_work"}
    forward = analysis.fetch_profile_stats_by_step(3, end_phase=StepPhase.FORWARD_PASS_END)
    assert len(forward) == 1
    assert pyinstrument_functions(forward) == {"tp_forward_work"}
    after_forward = analysis.fetch_profile_stats_by_step(
        2, 3, start_phase=StepPhase.FORWARD_PASS_END, end_phase=StepPhase.STEP_START
    )
    assert pyinstrument_functions(after_forward) == {"tp_backward_work", "tp_between_steps_work"}
    assert pyinstrument_functions(analysis.fetch_post_hook_close_profile_stats()) == {"tp_teardown_work"}


def test_cprofile_windows_tensorflow(run_script):
    run = run_script(
        "loop.py",
        {"framework": "tensorflow", "phases": [["train", 5]], "events": False, "work_ms": 2},
        config=python_config(StartStep=2, NumSteps=2, ProfilerName="cProfile", cProfileTimer="cpu_time"),
    ).check()
    node, dirs = stats_dirs(run.out, "tensorflow", "cprofile")
    assert set(dirs) == SMDEBUG_TENSORFLOW_WINDOWS
    assert_windows_ordered(dirs)
    assert not (run.out / "framework" / "pytorch").exists()

    analysis = cProfileAnalysis(local_profile_dir=str(run.out / "framework" / "tensorflow" / "cprofile"))
    assert analysis.list_profile_stats().shape[0] == len(SMDEBUG_TENSORFLOW_WINDOWS)
    in_step = analysis.fetch_profile_stats_by_step(2)  # STEP_START .. STEP_END
    assert cprofile_functions(in_step) == {"tp_forward_work", "tp_backward_work"}
    between = analysis.fetch_profile_stats_by_step(2, 3, start_phase=StepPhase.STEP_END, end_phase=StepPhase.STEP_START)
    assert cprofile_functions(between) == {"tp_between_steps_work"}
    assert cprofile_functions(analysis.fetch_pre_step_zero_profile_stats()) == {"tp_setup_work"}
    assert cprofile_functions(analysis.fetch_post_hook_close_profile_stats()) == {"tp_teardown_work"}


def function_times(stats_path):
    """{work function: cumulative time} of one cProfile stats file."""
    ps = pstats.Stats(str(stats_path))
    out = {}
    for (_, _, fn), (_, _, _, cumtime, _) in ps.stats.items():
        out[fn] = out.get(fn, 0.0) + cumtime
    return out


def test_cprofile_default_timer_cycles(run_script):
    """cProfileTimer "default": steps 9, 10, 11 are profiled with total, cpu and off-cpu
    time (smdebug's cProfileDefaultPythonProfiler). In each of those forward passes the loop
    spends 100 ms of CPU in tp_heavy_work and sleeps 100 ms in tp_forward_sleep, and measures
    both with os.times() itself; cProfile's cumulative time of each must be what the step's
    timer sees (wall; user + system; wall - (user + system)), up to os.times()' 10 ms ticks.
    A wrong timer is off by ~100 ms for one of the two functions."""
    run = run_script(
        "loop.py",
        {
            "phases": [["train", 13]],
            "events": False,
            "work_ms": 0.2,
            "heavy_steps": [9, 10, 11],
            "heavy_work_ms": 100,
            "heavy_sleep_ms": 100,
        },
        config=python_config(StartStep=9, NumSteps=3, ProfilerName="cProfile", cProfileTimer="default"),
    ).check()
    _, dirs = stats_dirs(run.out, "pytorch", "cprofile")
    expected = {"prestepzero-*-start_train-0-stepstart", "prestepzero-*-end_posthookclose-*-end"}
    for s in (9, 10, 11):
        expected.add(f"train-{s}-stepstart_train-{s}-forwardpassend")
        expected.add(f"train-{s}-forwardpassend_train-{s + 1}-stepstart")
    assert set(dirs) == expected

    timers = {
        9: lambda t: t["wall"],  # total_time
        10: lambda t: t["cpu"],  # cpu_time
        11: lambda t: t["wall"] - t["cpu"],  # off_cpu_time
    }
    heavy = run.manifest["heavy"]
    for step, timer in timers.items():
        seen = function_times(dirs[f"train-{step}-stepstart_train-{step}-forwardpassend"][0] / "python_stats")
        for fn, key in (("tp_heavy_work", "work"), ("tp_forward_sleep", "sleep")):
            want = timer(heavy[str(step)][key])
            assert abs(seen[fn] - want) <= 0.035, (step, fn, seen[fn], want, heavy[str(step)])
    # The two functions tell the timers apart: asleep costs no CPU, busy costs CPU.
    assert heavy["10"]["sleep"]["cpu"] < 0.03 and heavy["10"]["work"]["cpu"] > 0.07


def test_pyinstrument_missing_is_one_warning(run_script, tmp_path, package_dir):
    """Without pyinstrument the loop runs, Pyinstrument windows are skipped with one line."""
    fake = tmp_path / "fake" / "pyinstrument"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("raise ImportError('pyinstrument is not installed (test)')\n")
    run = run_script(
        "loop.py",
        {"phases": [["train", 5]], "events": False},
        config=python_config(StartStep=2, NumSteps=2, ProfilerName="Pyinstrument"),
        pythonpath=f"{package_dir}{os.pathsep}{fake.parent}",
    ).check()
    warnings = run.warnings()
    assert len(warnings) == 1 and "pyinstrument" in warnings[0], run.proc.stderr
    assert not (run.out / "framework" / "pytorch").exists()
    assert run.manifest["stats"]["written"] == 5  # the timeline is unaffected


def test_pyinstrument_failure_writes_smdebugs_placeholder(run_script, tmp_path, package_dir):
    """When pyinstrument fails to render, each window gets what smdebug writes then:
    {"root_frame": null} and an HTML page saying so; one warning, the loop goes on."""
    fake = tmp_path / "fake" / "pyinstrument"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text(
        "class Profiler:\n"
        "    last_session = None\n"
        "    def start(self): pass\n"
        "    def stop(self): pass\n"
        "    def output_html(self): raise AssertionError('broken (test)')\n"
    )
    (fake / "renderers.py").write_text(
        "class JSONRenderer:\n"
        "    def render(self, session): raise AssertionError('broken (test)')\n"
        "HTMLRenderer = JSONRenderer\n"
    )
    run = run_script(
        "loop.py",
        {"phases": [["train", 5]], "events": False},
        config=python_config(StartStep=2, NumSteps=2, ProfilerName="pyinstrument"),
        pythonpath=f"{package_dir}{os.pathsep}{fake.parent}",
    ).check()
    warnings = run.warnings()
    assert len(warnings) == 1 and "pyinstrument failed" in warnings[0], run.proc.stderr
    _, dirs = stats_dirs(run.out, "pytorch", "pyinstrument")
    assert set(dirs) == SMDEBUG_PYTORCH_WINDOWS
    for path, _, _ in dirs.values():
        assert json.loads((path / "python_stats.json").read_text()) == {"root_frame": None}
        assert (path / "python_stats.html").read_text() == "An error occurred during profiling!"
    analysis = PyinstrumentAnalysis(local_profile_dir=str(run.out / "framework" / "pytorch" / "pyinstrument"))
    assert analysis.list_profile_stats().shape[0] == 2 * len(SMDEBUG_PYTORCH_WINDOWS)
