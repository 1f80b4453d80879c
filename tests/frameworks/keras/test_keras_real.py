"""trainprof.keras against real TensorFlow (the opt-in tier: scripts/test-frameworks keras).

A small model.fit (with validation), evaluate and predict run with ProfilerCallback in a
subprocess; smdebug 1.0.34's LocalAlgorithmMetricsReader reads back the step events of
every mode and the TF profiler's events of the detailed window, which covers exactly the
configured train steps."""

import collections
import json
import os
import pathlib
import subprocess
import sys

from smdebug.profiler.algorithm_metrics_reader import LocalAlgorithmMetricsReader

ROOT = pathlib.Path(__file__).resolve().parents[3]
PACKAGE_DIR = ROOT / "hook-ffi" / "python"
SCRIPT = pathlib.Path(__file__).resolve().parent / "fit_script.py"
_CLEARED_ENV = ("SMPROFILER_CONFIG_PATH", "TRAINPROF_LOCAL_PATH", "TRAINPROF_DISABLE", "PYTHONPATH", "RANK")

DETAILED = {"StartStep": 3, "NumSteps": 3}  # train steps 3, 4, 5
EPOCHS, SAMPLES, BATCH = 2, 64, 8  # 8 train steps per epoch, 2 validation steps per epoch


def run_fit(tmp_path, params=None):
    out = tmp_path / "out"
    config = tmp_path / "profilerconfig.json"
    config.write_text(
        json.dumps({"ProfilingParameters": {"LocalPath": str(out), "DetailedProfilingConfig": json.dumps(DETAILED)}})
    )
    manifest = tmp_path / "manifest.json"
    env = {k: v for k, v in os.environ.items() if k not in _CLEARED_ENV}
    env.update(
        PYTHONPATH=str(PACKAGE_DIR),
        SMPROFILER_CONFIG_PATH=str(config),
        TRAINPROF_RESOURCE_CONFIG=str(tmp_path / "no-resourceconfig.json"),
        TRAINPROF_TEST_MANIFEST=str(manifest),
        TRAINPROF_TEST_PARAMS=json.dumps(dict(params or {}, epochs=EPOCHS, samples=SAMPLES, batch=BATCH)),
        TF_CPP_MIN_LOG_LEVEL="1",
        CUDA_VISIBLE_DEVICES="",
    )
    proc = subprocess.run(
        [sys.executable, str(SCRIPT)], env=env, cwd=str(tmp_path), capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, f"stdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
    return out, json.loads(manifest.read_text()), proc


def test_fit_evaluate_predict_read_back_by_smdebug(tmp_path):
    out, m, proc = run_fit(tmp_path)
    assert "tensorflow" in m["callback_bases"][2] or "keras" in m["callback_bases"][2], m["callback_bases"]
    assert "trainprof:" not in proc.stderr, proc.stderr  # no warning: everything was there
    assert m["running_after_fit"] is False

    events = LocalAlgorithmMetricsReader(trace_root_folder=str(out)).get_events(0, 10**18)
    steps = [e for e in events if e.event_phase.startswith("Step:ModeKeys.")]
    got = collections.Counter((e.event_phase, int(e.event_args["step_num"])) for e in steps)
    train_steps = EPOCHS * SAMPLES // BATCH
    val_steps = 16 // BATCH
    want = collections.Counter(
        [("Step:ModeKeys.TRAIN", s) for s in range(train_steps)]
        # validation after each epoch, then evaluate(): eval steps counted on across them
        + [("Step:ModeKeys.EVAL", s) for s in range(val_steps * (EPOCHS + 1))]
        + [("Step:ModeKeys.PREDICT", s) for s in range(val_steps)]
    )
    assert got == want
    assert all(e.event_args["pid"] == m["pid"] for e in steps)

    # The detailed window: one TF log dir, named after train step 3, with its metadata file.
    root = out / "framework" / "tensorflow" / "detailed_profiling"
    step_dirs = [p for p in root.glob("*/*") if p.is_dir()]
    assert [p.name for p in step_dirs] == ["000000003"], step_dirs
    log_dir = step_dirs[0]
    metas = list(log_dir.glob("*.metadata"))
    assert len(metas) == 1 and metas[0].stat().st_size == 0, metas
    node, start_us, end_us = metas[0].name[: -len(".metadata")].split("_")
    assert node == m["node_id"] and int(start_us) < int(end_us)
    traces = list(log_dir.glob("plugins/profile/*/*.trace.json.gz"))
    assert len(traces) == 1, list(log_dir.rglob("*"))
    assert not list((out / ".tmp").rglob("tf-detailed-*")) if (out / ".tmp").exists() else True

    tf_events = [e for e in events if e.file_type == "TFProfilerMetrics"]
    assert len(tf_events) > 50, len(tf_events)
    train = {int(e.event_args["step_num"]): e for e in steps if e.event_phase == "Step:ModeKeys.TRAIN"}

    def inside(e, s):
        return train[s].start_time <= e.start_time and e.end_time <= train[s].end_time

    per_step = {s: sum(1 for e in tf_events if inside(e, s)) for s in train}
    print("TF events:", len(tf_events), "inside each train step:", per_step)
    assert all(per_step[s] > 0 for s in (3, 4, 5)), per_step
    assert all(per_step[s] == 0 for s in train if s not in (3, 4, 5)), per_step
    # Nothing of the trace lies outside the window [begin of step 3, stop after step 5].
    assert min(e.start_time for e in tf_events) >= train[3].start_time
    assert max(e.start_time for e in tf_events) <= int(end_us)
    assert min(e.start_time for e in tf_events) <= train[3].end_time
    print(json.dumps({k: m[k] for k in ("tf_version", "import_s", "fit_s", "detailed_stop_us", "stats")}))
