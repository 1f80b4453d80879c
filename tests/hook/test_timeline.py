"""A Python training loop through the trainprof package, read back with smdebug 1.0.34's
LocalAlgorithmMetricsReader: every event the loop recorded, with its step, phase and
arguments; rotated, sealed, uniquely named files; window answers as the config says."""

import collections
import json
import os
import time

import pytest
from smdebug.profiler.algorithm_metrics_reader import LocalAlgorithmMetricsReader
from smdebug.profiler.profiler_config_parser import MetricsCategory, ProfilerConfigParser

DETAILED = {"StartStep": 2, "NumSteps": 1}
DATALOADER = {"StartStep": 1, "NumSteps": 2, "MetricsRegex": ".*DataLoaderIter::GetNext"}
PYTHON = {"StartStep": 2, "NumSteps": 2, "ProfilerName": "cProfile", "cProfileTimer": "total_time"}
DATALOADER_NAME = "_SingleProcessDataLoaderIter.DataLoaderIter::GetNext"  # what loop.py asks about
CONFIG = {
    "RotateMaxFileSizeInBytes": 1500,
    "DetailedProfilingConfig": DETAILED,
    "DataloaderProfilingConfig": DATALOADER,
    "PythonProfilingConfig": PYTHON,
}


def read_events(out):
    reader = LocalAlgorithmMetricsReader(trace_root_folder=str(out))
    return reader.get_events(0, 10**18)


def timeline_files(out):
    root = out / "framework" / "pevents"
    return sorted(p for p in root.rglob("*") if p.is_file())


def key_of(phase, name, step):
    return (phase, name, str(step))


def test_loop_events_read_back_by_smdebug(run_script):
    run = run_script("loop.py", {"phases": [["train", 6], ["eval", 3]]}, config=CONFIG).check()
    m = run.manifest
    assert m["init_status"] == 0
    assert m["steps"] == [["train", s] for s in range(6)] + [["eval", s] for s in range(3)]
    node = m["node_id"]
    assert node == f"{m['pid']}-{node.split('-', 1)[1]}" and "_" not in node

    # Files: several (rotation at 1500 bytes), sealed, uniquely named, each a JSON array.
    files = timeline_files(run.out)
    assert len(files) >= 3, files
    names = [p.name for p in files]
    assert len(set(names)) == len(names), names
    for p in files:
        assert p.name.endswith(f"_{node}_pythontimeline.json"), p
        doc = json.loads(p.read_text())
        assert isinstance(doc, list) and doc, p
        base = doc[0]["args"]["start_time_since_epoch_in_micros"]
        assert base > 0, p
        # Named after (at least) the latest event end inside, in that time's UTC hour folder.
        t_us = int(p.name.split("_")[0])
        assert p.parent.name == time.strftime("%Y%m%d%H", time.gmtime(t_us / 1e6)), p
        ends = [base + e["ts"] + e["dur"] for e in doc if e.get("ph") == "X"]
        assert ends and max(ends) <= t_us, p
    assert m["tmp_after_close"] == []
    leftovers = [os.path.join(d, n) for d, ds, fs in os.walk(run.out) for n in ds + fs if n.endswith(".tmp")]
    assert leftovers == []

    # Every recorded event, and nothing else, with its step and phase.
    events = read_events(run.out)
    got = collections.Counter(key_of(e.event_phase, e.event_name, e.event_args.get("step_num")) for e in events)
    want = collections.Counter(key_of(e["phase"], e["name"], e["step"]) for e in m["events"])
    assert got == want
    assert len(events) == len(m["events"]) == m["stats"]["written"]
    assert m["stats"]["files_sealed"] == len(files)
    assert m["stats"]["dropped_queue_full"] == 0 and m["stats"]["dropped_writer"] == 0 and m["dropped"] == 0

    phases = {e.event_phase for e in events}
    assert {"Step:ModeKeys.TRAIN", "Step:ModeKeys.EVAL", "Forward", "DataLoaderIter", "DataLoaderWorker"} == phases
    steps = collections.Counter(
        (e.event_phase, int(e.event_args["step_num"])) for e in events if "Step:" in e.event_phase
    )
    assert steps == collections.Counter(
        [("Step:ModeKeys.TRAIN", s) for s in range(6)] + [("Step:ModeKeys.EVAL", s) for s in range(3)]
    )

    # Arguments: the OS pid, numbers, booleans and floats as the loop passed them.
    wanted_args = {key_of(e["phase"], e["name"], e["step"]): e["args"] for e in m["events"]}
    for e in events:
        assert e.event_args["pid"] == m["pid"]
        assert e.node_id == node
        extra = {k: v for k, v in e.event_args.items() if k not in ("pid", "step_num")}
        assert extra == wanted_args[key_of(e.event_phase, e.event_name, e.event_args["step_num"])]
    dl = [e for e in events if e.event_phase == "DataLoaderIter"]
    assert len(dl) == 9 and all(type(e.event_args["pin_memory"]) is bool for e in dl)
    assert all(type(e.event_args["ratio"]) is float for e in dl)

    # Times: a step contains its own Forward event.
    by_key = {(e.event_phase, e.event_args["step_num"]): e for e in events}
    for mode, step in m["steps"]:
        st = by_key[(f"Step:ModeKeys.{mode.upper()}", str(step))]
        fw = [e for e in events if e.event_phase == "Forward" and e.event_args["step_num"] == str(step)]
        assert any(st.start_time <= f.start_time <= f.end_time <= st.end_time for f in fw), (mode, step)

    # After close() nothing is recorded and no window is open.
    assert m["active_after_close"] is False
    assert not any(e.event_name == "AfterClose" for e in events)


@pytest.mark.parametrize("framework", ["pytorch", "tensorflow"])
def test_window_answers_match_the_config(run_script, monkeypatch, framework):
    """``active()`` at the current step: smdebug's PyTorch hook asks at its global step
    (every mode counted together), its TensorFlow hook at the mode's own step. Train 2,
    eval 3, train 2: global steps 0-6, eval 0-2 at global 2-4, train 2-3 at global 5-6."""
    phases = [["train", 2], ["eval", 3], ["train", 2]]
    run = run_script("loop.py", {"framework": framework, "phases": phases, "events": False}, config=CONFIG).check()
    m = run.manifest
    assert [a["global"] for a in m["active"]] == list(range(7))
    asked = "global" if framework == "pytorch" else "step"
    expected = {
        "detailed": {2},
        "dataloader": {1, 2},
        "python": {2, 3},
        "smdataparallel": set(),
    }
    for a in m["active"]:
        for feature, steps in expected.items():
            assert a[feature] == (a[asked] in steps), (feature, a)
        assert a["dataloader_other"] is False, a  # the MetricsRegex does not match that name
    opened = [(a["mode"], a["step"]) for a in m["active"] if a["detailed"]]
    assert opened == ([("eval", 0)] if framework == "pytorch" else [("eval", 2), ("train", 2)])

    # smdebug's own parser answers the same for the same file and step numbers.
    monkeypatch.setenv("SMPROFILER_CONFIG_PATH", str(run.out.parent / "profilerconfig.json"))
    parser = ProfilerConfigParser()
    categories = {
        "detailed": MetricsCategory.DETAILED_PROFILING,
        "python": MetricsCategory.PYTHON_PROFILING,
        "smdataparallel": MetricsCategory.SMDATAPARALLEL_PROFILING,
    }
    for a in m["active"]:
        for feature, category in categories.items():
            assert a[feature] == parser.should_save_metrics(category, a[asked]), (feature, a)
        assert a["dataloader"] == parser.should_save_metrics(
            MetricsCategory.DATALOADER_PROFILING, a[asked], metrics_name=DATALOADER_NAME
        ), a
