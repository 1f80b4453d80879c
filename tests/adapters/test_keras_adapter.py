"""trainprof.keras without TensorFlow (the normal tier): ProfilerCallback driven in Keras'
calling order against a fake ``tensorflow`` module (keras_support.py), output read back with
smdebug 1.0.34's LocalAlgorithmMetricsReader. Runs only where tensorflow is absent; the
real thing is tests/frameworks/keras (scripts/test-frameworks keras)."""

import collections
import datetime
import gzip
import importlib.util
import json
import pathlib
import sys
import types

import pytest
from smdebug.profiler.algorithm_metrics_reader import LocalAlgorithmMetricsReader

if importlib.util.find_spec("tensorflow") is not None:
    pytest.skip("tensorflow is installed: tests/frameworks/keras tests the real thing", allow_module_level=True)

SCRIPT = pathlib.Path(__file__).resolve().parent / "keras_support.py"
PACKAGE_DIR = pathlib.Path(__file__).resolve().parents[2] / "hook-ffi" / "python"
sys.path.insert(0, str(PACKAGE_DIR))

from trainprof import keras as tpk  # noqa: E402

DETAILED = {"StartStep": 3, "NumSteps": 3}  # train steps 3, 4, 5
EPOCHS, STEPS, VAL, EVAL, PREDICT = 2, 5, 2, 2, 3  # train steps 0-9; the window spans an epoch's end


def run_keras(run_trainer, config=None, **params):
    p = dict(epochs=EPOCHS, steps=STEPS, val_steps=VAL, eval_steps=EVAL, predict_steps=PREDICT)
    p.update(params)
    return run_trainer(SCRIPT, p, config=config).check()


def read(out):
    return LocalAlgorithmMetricsReader(trace_root_folder=str(out)).get_events(0, 10**18)


def step_counts(events):
    return collections.Counter(
        (e.event_phase, int(e.event_args["step_num"])) for e in events if e.event_phase.startswith("Step:ModeKeys.")
    )


WANT_STEPS = collections.Counter(
    [("Step:ModeKeys.TRAIN", s) for s in range(EPOCHS * STEPS)]
    + [("Step:ModeKeys.EVAL", s) for s in range(EPOCHS * VAL + EVAL)]
    + [("Step:ModeKeys.PREDICT", s) for s in range(PREDICT)]
)


def timeline_events(out):
    """Every event of the rank's timeline files (docs/formats.md, "Timeline files")."""
    found = []
    for f in (out / "framework" / "pevents").rglob("*.json"):
        found.extend(json.loads(f.read_text()))
    return found


def detailed_dirs(out):
    root = out / "framework" / "tensorflow" / "detailed_profiling"
    return sorted(p for p in root.glob("*/*") if p.is_dir())


@pytest.mark.parametrize("tf", ["xplane", "json"])
def test_steps_and_detailed_window_read_back_by_smdebug(run_trainer, tf):
    run = run_keras(run_trainer, {"DetailedProfilingConfig": DETAILED}, tf=tf)
    m = run.manifest
    assert run.warnings() == []
    assert m["base"][1] == "trainprof.keras._ProfilerCallbackMixin"
    assert m["base"][2] == "__main__.Callback"  # tf.keras.callbacks.Callback of the fake

    events = read(run.out)
    assert step_counts(events) == WANT_STEPS
    assert m["stats"]["written"] == sum(WANT_STEPS.values()) and m["stats"]["dropped_queue_full"] == 0

    # The TF profiler ran once: started at train step 3's begin into a staging folder,
    # stopped at train step 5's end (not at step 6's begin, nor at on_train_end).
    assert [c[0] for c in m["tf_calls"]] == ["start", "stop"]
    staging = m["tf_calls"][0][1]
    assert staging.startswith(str(run.out / ".tmp" / m["node_id"])) and staging.endswith("tf-detailed-000000003")
    assert m["running_after_train_batch"] == [s in (3, 4) for s in range(EPOCHS * STEPS)]
    assert m["running_after_fit"] is False

    # The layout of docs/formats.md ("TensorFlow detailed profiling"), moved into place: the
    # hour folder is local time, the step 9 digits.
    dirs = detailed_dirs(run.out)
    assert [d.name for d in dirs] == ["000000003"]
    hour = dirs[0].parent.name
    assert datetime.datetime.strptime(hour, "%Y%m%d%H")
    assert not pathlib.Path(staging).exists()
    metas = list(dirs[0].glob("*.metadata"))
    assert len(metas) == 1 and metas[0].stat().st_size == 0
    node, start_us, end_us = metas[0].name[: -len(".metadata")].split("_")
    assert node == m["node_id"] and int(start_us) < int(end_us)
    traces = list(dirs[0].glob("plugins/profile/*/*.trace.json.gz"))
    assert [t.name for t in traces] == [m["host"] + ".trace.json.gz"]
    if tf == "xplane":  # the converted file sits beside TF's own
        assert traces[0].with_name(m["host"] + ".xplane.pb").is_file()
        doc = json.loads(gzip.decompress(traces[0].read_bytes()))
        assert {e["name"] for e in doc["traceEvents"] if e["ph"] == "M"} == {"process_name", "thread_name"}
    leftovers = [p for p in run.out.rglob("*") if p.name.endswith((".part", ".tmp")) and p.is_file()]
    assert leftovers == []

    # smdebug reads the TF events (node: the host part of the file name), each inside one of
    # the window's train steps or the validation steps between steps 4 and 5.
    tf_events = [e for e in events if e.file_type == "TFProfilerMetrics"]
    names = collections.Counter(e.event_name for e in tf_events)
    assert names == {"train_function": 3, "test_function": VAL}, names
    assert {e.node_id for e in tf_events} == {m["host"].split(".")[0]}
    steps = {(e.event_phase, int(e.event_args["step_num"])): e for e in events if "Step:" in e.event_phase}
    train = [e for e in tf_events if e.event_name == "train_function"]
    # In the json case the trace times count from the TF session's start, and the metadata's
    # start is read just before start() (never after it): every event looks earlier by the
    # same `shift`, start()'s own duration, which a loaded machine can make milliseconds.
    # With the XSpace the session start is exact and the shift is 0.
    shift = m["tf_starts_ns"][0] / 1000 - int(start_us) if tf == "json" else 0
    assert shift >= -1, shift
    for e in tf_events:
        begin, end = e.start_time + shift, e.end_time + shift
        # The hook's times are whole µs (truncated), the TF events' keep fractions: an event
        # that ends less than 1 µs before its step does can read up to 1 µs past its end.
        hits = [k for k, s in steps.items() if s.start_time <= begin and end < s.end_time + 1]
        want_phase = "Step:ModeKeys.TRAIN" if e.event_name == "train_function" else "Step:ModeKeys.EVAL"
        assert len(hits) == 1 and hits[0][0] == want_phase, (e.event_name, e.start_time, e.end_time, hits, sorted((s.start_time, s.end_time, k) for k, s in steps.items()))
    in_train = sorted(
        k[1] for e in train for k, s in steps.items() if s.start_time <= e.start_time + shift <= s.end_time
    )
    assert in_train == [3, 4, 5]
    assert int(start_us) <= min(e.start_time for e in tf_events) and max(e.end_time for e in tf_events) <= int(end_us)


def test_a_window_stops_at_its_memory_cap_and_says_so(run_trainer):
    """``WindowCapsConfig.DetailedMaxMemoryMiB`` (docs/formats.md, "Window caps"): the fake TF
    profiler keeps 3 MiB an op (one op a batch); with a 4 MiB cap the window of train steps
    3-5 is stopped at step 5's start, what it took is written, and one
    ``trainprof:WindowCapped`` event says so."""
    caps = {"DetailedMaxMemoryMiB": 4}
    r = run_keras(run_trainer, {"DetailedProfilingConfig": DETAILED, "WindowCapsConfig": caps},
                  op_bytes=3 << 20, val_steps=0)
    assert [c[0] for c in r.manifest["tf_calls"]] == ["start", "stop"], r.manifest["tf_calls"]
    assert r.manifest["running_after_train_batch"][3:6] == [True, True, False]
    assert len(detailed_dirs(r.out)) == 1
    capped = [e for e in timeline_events(r.out) if e.get("name") == "trainprof:WindowCapped"]
    assert len(capped) == 1, capped
    a = capped[0]["args"]
    assert (a["feature"], a["cap"], a["limit"], a["step"]) == ("detailed", "bytes", 4 << 20, 5), a
    assert a["value"] >= 4 << 20, a
    assert r.proc.stderr.count("the detailed window stopped at its cap at step 5") == 1, r.proc.stderr


def test_a_memory_cap_out_of_reach_stops_nothing(run_trainer):
    r = run_keras(run_trainer, {"DetailedProfilingConfig": DETAILED}, op_bytes=3 << 20, val_steps=0)
    assert r.manifest["running_after_train_batch"][3:6] == [True, True, False]
    assert [c[0] for c in r.manifest["tf_calls"]] == ["start", "stop"]
    assert not [e for e in timeline_events(r.out) if e.get("name") == "trainprof:WindowCapped"]


def test_without_detailed_window_the_tf_profiler_is_never_touched(run_trainer):
    run = run_keras(run_trainer, {})
    m = run.manifest
    assert run.warnings() == []
    assert m["tf_calls"] == [] and detailed_dirs(run.out) == []
    assert step_counts(read(run.out)) == WANT_STEPS


def test_window_open_at_the_end_of_fit_is_stopped_by_on_train_end(run_trainer):
    run = run_keras(run_trainer, {"DetailedProfilingConfig": {"StartStep": 8, "NumSteps": 5}})
    m = run.manifest
    assert [c[0] for c in m["tf_calls"]] == ["start", "stop"]
    assert m["running_after_train_batch"][-1] is True and m["running_after_fit"] is False
    assert [d.name for d in detailed_dirs(run.out)] == ["000000008"]
    tf_events = [e for e in read(run.out) if e.file_type == "TFProfilerMetrics"]
    assert collections.Counter(e.event_name for e in tf_events) == {"train_function": 2, "test_function": VAL}


def test_one_step_window(run_trainer):
    run = run_keras(run_trainer, {"DetailedProfilingConfig": {"StartStep": 1, "NumSteps": 1}})
    m = run.manifest
    assert [c[0] for c in m["tf_calls"]] == ["start", "stop"]
    assert m["running_after_train_batch"] == [False] * (EPOCHS * STEPS)
    assert [d.name for d in detailed_dirs(run.out)] == ["000000001"]


@pytest.mark.parametrize(
    "tf, warning",
    [
        ("no_profiler", "the TF profiler (tf.profiler.experimental.start / stop) is not available"),
        ("busy", "cannot start the TF profiler for the detailed window at train step 3"),
        ("absent", "neither tf.keras nor keras can be imported"),
    ],
)
def test_missing_pieces_turn_detailed_profiling_off_with_one_warning(run_trainer, tf, warning):
    run = run_keras(run_trainer, {"DetailedProfilingConfig": DETAILED}, tf=tf)
    m = run.manifest
    warnings = run.warnings()
    # Without tensorflow the TF profiler's absence is its own line.
    assert len(warnings) == (2 if tf == "absent" else 1) and warning in warnings[0], warnings
    # Training went on and every step was recorded.
    assert step_counts(read(run.out)) == WANT_STEPS
    assert detailed_dirs(run.out) == []
    if tf == "busy":  # one try per window, not one per step
        assert [c[0] for c in m["tf_calls"]] == ["start"]
    if tf == "absent":
        assert m["base"][-1] == "builtins.object" and m["modules"] == []


def test_no_xplane_module_keeps_the_xplane_profile_with_one_warning(run_trainer):
    run = run_keras(run_trainer, {"DetailedProfilingConfig": DETAILED}, no_xplane_module=True)
    warnings = run.warnings()
    assert len(warnings) == 1 and "no XSpace protobuf module" in warnings[0], warnings
    d = detailed_dirs(run.out)
    assert [x.name for x in d] == ["000000003"]
    assert len(list(d[0].glob("*.metadata"))) == 1
    assert [p.name for p in d[0].glob("plugins/profile/*/*")] == [run.manifest["host"] + ".xplane.pb"]
    assert step_counts(read(run.out)) == WANT_STEPS


def test_profiling_off_records_nothing_and_never_starts_tf(run_trainer):
    run = run_trainer(SCRIPT, {"epochs": 1, "steps": 3}).check()  # no config file
    m = run.manifest
    assert m["tf_calls"] == [] and run.warnings() == []
    assert not run.out.exists()


def test_importing_trainprof_keras_imports_no_framework(run_trainer):
    code = (
        "import sys, trainprof, trainprof.keras; "
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('tensorflow', 'keras', 'torch')))"
    )
    import subprocess

    out = subprocess.run(
        [sys.executable, "-c", code], env={"PYTHONPATH": str(PACKAGE_DIR)}, capture_output=True, text=True
    )
    assert out.returncode == 0 and out.stdout.strip() == "[]", out


# --- pure parts, in this process ---------------------------------------------------------------


def test_local_path_follows_the_hook(tmp_path):
    """The callback's default root is the library's own LocalPath (``trainprof_local_path``):
    ``TRAINPROF_LOCAL_PATH`` when set and not blank, else the config's (keys in any case)."""
    import os
    import subprocess

    cfg = tmp_path / "c.json"
    code = "import trainprof; p = trainprof.Profiler(framework='tensorflow'); print(p.local_path); p.close()"

    def local_path(override=None):
        env = {k: v for k, v in os.environ.items() if k != "TRAINPROF_LOCAL_PATH"}
        env.update(PYTHONPATH=str(PACKAGE_DIR), SMPROFILER_CONFIG_PATH=str(cfg))
        if override is not None:
            env["TRAINPROF_LOCAL_PATH"] = override
        out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
        assert out.returncode == 0, out
        return out.stdout.strip()

    assert local_path() == "None"  # no config file, no override: profiling is off
    cfg.write_text(json.dumps({"profilingparameters": {"LOCALPATH": str(tmp_path / "Prof")}}))
    assert local_path() == str(tmp_path / "Prof")
    assert local_path(" ") == str(tmp_path / "Prof")  # blank override: not set
    assert local_path(str(tmp_path / "env")) == str(tmp_path / "env")


def test_log_dir_and_metadata_names():
    t = datetime.datetime(2026, 3, 4, 5, 6, 7)
    assert tpk.detailed_log_dir("/r", 12, today=t) == "/r/framework/tensorflow/detailed_profiling/2026030405/000000012"
    assert tpk.metadata_name("7-algo-1", 10.5, 20.4) == "7-algo-1_10_20.metadata"


def _ns(**kw):
    return types.SimpleNamespace(**kw)


def test_xspace_events():
    md = {1: _ns(name="op", display_name=""), 2: _ns(name="raw", display_name="Pretty")}
    plane = _ns(
        name="/host:CPU",
        event_metadata=md,
        stat_metadata={},
        stats=[],
        lines=[
            _ns(
                id=5,
                display_id=0,
                name="python",
                display_name="",
                timestamp_ns=2_000,
                events=[_ns(metadata_id=1, offset_ps=500_000, duration_ps=3_000_000)],
            ),
            _ns(id=6, display_id=9, name="t", display_name="T", timestamp_ns=0, events=[]),  # no events: left out
            _ns(
                id=8,
                display_id=0,
                name="w",
                display_name="",
                timestamp_ns=0,
                events=[_ns(metadata_id=2, offset_ps=0, duration_ps=1), _ns(metadata_id=3, offset_ps=0, duration_ps=0)],
            ),
        ],
    )
    empty = _ns(name="Task Environment", lines=[], event_metadata={}, stat_metadata={}, stats=[])
    evs = tpk.xspace_trace_events(_ns(planes=[empty, plane]))
    assert evs[0] == {"name": "process_name", "ph": "M", "pid": 1, "args": {"name": "/host:CPU"}}
    xs = [e for e in evs if e["ph"] == "X"]
    assert xs[0] == {"name": "op", "ph": "X", "pid": 1, "tid": 5, "ts": 2.5, "dur": 3.0}
    assert [e["name"] for e in xs] == ["op", "Pretty", "3"]
    assert [e["args"]["name"] for e in evs if e["name"] == "thread_name"] == ["python", "w"]


def test_publish_merges_into_an_existing_dir(tmp_path):
    final = tmp_path / "final"
    (final / "plugins" / "profile" / "a").mkdir(parents=True)
    (final / "plugins" / "profile" / "a" / "h.trace.json.gz").write_text("old")
    staging = tmp_path / "staging"
    (staging / "plugins" / "profile" / "b").mkdir(parents=True)
    (staging / "plugins" / "profile" / "b" / "h.trace.json.gz").write_text("new")
    (staging / "n_1_2.metadata").write_text("")
    tpk._publish(str(staging), str(final))
    assert not staging.exists()
    assert sorted(str(p.relative_to(final)) for p in final.rglob("*") if p.is_file()) == [
        "n_1_2.metadata",
        "plugins/profile/a/h.trace.json.gz",
        "plugins/profile/b/h.trace.json.gz",
    ]
