"""End to end, the way a user runs it: the release-shaped pipeline on the example trainer.

`trainprof run --s3 s3://… -- python3 examples/train.py`, with a config written the way the
SageMaker SDK writes it (sub-configs as strings with trailing commas) that opens the
detailed, dataloader and Python-profiling windows, against a real S3-compatible server
(moto_server) on 127.0.0.1. Then smdebug 1.0.34 reads the output, from the disk and from
S3, the way its notebooks do; and every timeline file is checked as a Chrome trace (the
JSON Array Format that chrome://tracing and Perfetto load).
"""

import collections
import json
import math
import os
import pathlib
import subprocess
import sys

from s3_support import agent_env

ROOT = pathlib.Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "train.py"

STEPS, EVAL_EVERY, EVAL_STEPS = 24, 10, 3
INTERVAL_MS = 100
# (StartStep, NumSteps) of each window.
DETAILED, DATALOADER, PYTHON = (3, 2), (5, 2), (8, 2)
RUN_TIMEOUT_S = 120


def sdk_string(sub):
    """A sub-config as the SageMaker SDK writes it: a JSON-ish string, trailing comma."""
    return "{" + "".join(f"{json.dumps(k)}: {json.dumps(v)}, " for k, v in sub.items()) + "}"


def write_sdk_config(path, local_path):
    params = {
        "LocalPath": str(local_path),
        "RotateMaxFileSizeInBytes": "4000",  # several timeline files
        "RotateFileCloseIntervalInSeconds": "60",
        "FileOpenFailThreshold": "50",
        "DetailedProfilingConfig": sdk_string({"StartStep": DETAILED[0], "NumSteps": DETAILED[1]}),
        "DataloaderProfilingConfig": sdk_string(
            {"StartStep": DATALOADER[0], "NumSteps": DATALOADER[1], "MetricsRegex": ".*"}),
        "PythonProfilingConfig": sdk_string(
            {"StartStep": PYTHON[0], "NumSteps": PYTHON[1], "ProfilerName": "cprofile",
             "cProfileTimer": "total_time"}),
    }
    doc = {"S3OutputPath": "s3://overridden-by-the-flag/x", "DisableProfiler": False,
           "ProfilingIntervalInMilliseconds": INTERVAL_MS, "ProfilingParameters": params}
    path.write_text(json.dumps(doc, indent=2))
    return path


def steps_of(window):
    start, n = window
    return set(range(start, start + n))


# ------------------------------------------------------------------ Chrome trace checks

PHASES = set("BEXiIMCbensftPONDR")
METADATA = {"process_name", "process_labels", "process_sort_index", "thread_name", "thread_sort_index"}


def is_number(v):
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def chrome_trace_problems(text):
    """What keeps ``text`` from loading as a Trace Event Format file (JSON Array Format)
    in chrome://tracing / Perfetto: strict JSON, an array of event objects, each with a known
    ``ph``; ``X`` events with a name, numeric ``ts`` and ``dur`` >= 0 and an integer or string
    ``pid``; metadata events with a known name and an ``args`` object; ``B``/``E`` balanced
    per pid/tid. An empty list means none."""
    try:
        doc = json.loads(text)
    except ValueError as e:
        return [f"not strict JSON: {e}"]
    if not isinstance(doc, list):
        return [f"top level is {type(doc).__name__}, not an array"]
    problems, open_spans = [], collections.Counter()
    for i, e in enumerate(doc):
        where = f"event {i}"
        if not isinstance(e, dict):
            problems.append(f"{where}: not an object")
            continue
        ph = e.get("ph")
        if ph not in PHASES:
            problems.append(f"{where}: ph {ph!r}")
            continue
        if not isinstance(e.get("pid"), (int, str)) or isinstance(e.get("pid"), bool):
            problems.append(f"{where}: pid {e.get('pid')!r}")
        if "tid" in e and not isinstance(e["tid"], (int, str)):
            problems.append(f"{where}: tid {e['tid']!r}")
        if "args" in e and not isinstance(e["args"], dict):
            problems.append(f"{where}: args is not an object")
        if ph == "M":
            if e.get("name") not in METADATA or not isinstance(e.get("args"), dict):
                problems.append(f"{where}: metadata {e.get('name')!r} / args {e.get('args')!r}")
            continue
        if not isinstance(e.get("name"), str) or not e["name"]:
            problems.append(f"{where}: name {e.get('name')!r}")
        if not is_number(e.get("ts")):
            problems.append(f"{where}: ts {e.get('ts')!r}")
        if ph == "X" and not (is_number(e.get("dur")) and e["dur"] >= 0):
            problems.append(f"{where}: dur {e.get('dur')!r}")
        if ph in "BE":
            open_spans[(e.get("pid"), e.get("tid"))] += 1 if ph == "B" else -1
    problems += [f"unbalanced B/E on {k}: {n}" for k, n in open_spans.items() if n]
    return problems


def test_chrome_trace_check_rejects_what_the_viewers_reject():
    """The checker itself: each of these is refused (so a pass above means something)."""
    good = [{"name": "process_name", "ph": "M", "pid": 0, "args": {"name": "x"}},
            {"name": "n", "ph": "X", "pid": 1, "ts": 1, "dur": 2}]
    assert chrome_trace_problems(json.dumps(good)) == []
    bad = {
        "truncated": json.dumps(good)[:-1],
        "trailing comma": json.dumps(good)[:-1] + ",]",
        "object": json.dumps({"traceEvents": good}),
        "no ph": json.dumps([{"name": "n", "pid": 1, "ts": 1, "dur": 2}]),
        "negative dur": json.dumps([{"name": "n", "ph": "X", "pid": 1, "ts": 1, "dur": -1}]),
        "string ts": json.dumps([{"name": "n", "ph": "X", "pid": 1, "ts": "1", "dur": 1}]),
        "NaN": '[{"name": "n", "ph": "X", "pid": 1, "ts": NaN, "dur": 1}]',
        "unbalanced": json.dumps([{"name": "n", "ph": "B", "pid": 1, "tid": 1, "ts": 1}]),
        "bad metadata": json.dumps([{"name": "color", "ph": "M", "pid": 1, "args": {}}]),
    }
    for what, text in bad.items():
        assert chrome_trace_problems(text), what


# ------------------------------------------------------------------ the run


def test_example_trainer_under_run_with_s3_read_back_by_smdebug(trainprof_bin, hook_lib, s3, smdebug_s3, tmp_path):
    from smdebug.core.access_layer.utils import has_training_ended
    from smdebug.profiler.algorithm_metrics_reader import LocalAlgorithmMetricsReader, S3AlgorithmMetricsReader
    from smdebug.profiler.analysis.python_profile_analysis import cProfileAnalysis
    from smdebug.profiler.analysis.utils.profiler_data_to_pandas import PandasFrame
    from smdebug.profiler.system_metrics_reader import LocalSystemMetricsReader, S3SystemMetricsReader

    out = tmp_path / "out"
    config = write_sdk_config(tmp_path / "profilerconfig.json", out)
    prefix = "jobs/example-1/profiler-output"
    env = agent_env(s3.endpoint, SMPROFILER_CONFIG_PATH=config, TRAINPROF_HOOK_LIB=hook_lib,
                    TRAIN_STEPS=STEPS, EVAL_EVERY=EVAL_EVERY, EVAL_STEPS=EVAL_STEPS, PYTHONPATH=None)
    proc = subprocess.run(
        [trainprof_bin, "run", "--s3", s3.url(prefix), "--s3-endpoint", s3.endpoint, "--keep-local",
         "--", sys.executable, EXAMPLE],
        env=env, cwd=tmp_path, capture_output=True, text=True, timeout=RUN_TIMEOUT_S)
    assert proc.returncode == 0, f"stdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
    assert f"step  {STEPS - STEPS % EVAL_EVERY}" in proc.stdout, proc.stdout
    assert "profiled: " in proc.stdout and ", 0 dropped" in proc.stdout, proc.stdout
    assert " 0 failed attempts" in proc.stderr and "upload: 0 files left" in proc.stderr, proc.stderr

    # ---- local, as smdebug's readers and notebooks read it
    wide = (0, 10**18)
    system = LocalSystemMetricsReader(str(out)).get_events(*wide)
    framework = LocalAlgorithmMetricsReader(str(out)).get_events(*wide)
    assert system and framework
    names = collections.Counter((e.event_phase, e.event_name) for e in framework)

    # The step events: every train and eval step, once, numbered per mode.
    evals = STEPS // EVAL_EVERY * EVAL_STEPS
    for mode, n in (("TRAIN", STEPS), ("EVAL", evals)):
        phase = f"Step:ModeKeys.{mode}"
        got = sorted(int(e.event_args["step_num"]) for e in framework if e.event_phase == phase)
        assert got == list(range(n)), (phase, got)

    # The windows opened at the configured steps (per-mode step numbers: train steps and,
    # where eval reached them, eval steps) and nowhere else.
    def window_steps(*phases):
        return {int(e.event_args["step_num"]) for e in framework if e.event_phase in phases}

    assert window_steps("Forward", "Backward", "Optimizer") == steps_of(DETAILED), names
    assert names[("Backward", "Model.l1")] == DETAILED[1], names  # train steps only
    assert window_steps("DataLoaderIter") == steps_of(DATALOADER), names

    # System and framework events in one time range: sampling covered the training span
    # (within a second at either end) on the same clock, and a query of that span returns
    # both kinds.
    fw_start = min(e.start_time for e in framework)
    fw_end = max(e.end_time for e in framework)
    sys_times = sorted(e.timestamp for e in system)
    assert sys_times[0] * 1e6 <= fw_start + 1e6 and sys_times[-1] * 1e6 >= fw_end - 1e6, (
        sys_times[0], sys_times[-1], fw_start, fw_end)
    in_span = LocalSystemMetricsReader(str(out)).get_events(fw_start, fw_end)
    assert len({e.timestamp for e in in_span}) >= 3, len(in_span)
    frame = PandasFrame(str(out))
    sys_df, fw_df = frame.get_all_system_metrics(), frame.get_all_framework_metrics()
    assert len(fw_df) == len(framework) and len(sys_df) == len(system)
    assert sys_df["timestamp_us"].min() <= fw_df["start_time_us"].min() + 1e6
    assert sys_df["timestamp_us"].max() >= fw_df["end_time_us"].max() - 1e6
    assert {"cpu", "memory"} <= set(sys_df["type"].str.lower()), set(sys_df["type"])

    # The Python-profiling window: cProfile stats of the train steps, with the example's
    # own functions in them.
    cprofile_dir = out / "framework" / "pytorch" / "cprofile"
    stats = cProfileAnalysis(local_profile_dir=str(cprofile_dir)).fetch_profile_stats_by_step(
        PYTHON[0], PYTHON[0] + PYTHON[1])
    functions = {f.function_name for f in stats.function_stats_list}
    assert any("(train_step)" in f for f in functions), sorted(functions)[:20]

    # The end markers, as smdebug's rules look for them.
    assert has_training_ended(str(out / "system")) and has_training_ended(str(out / "framework"))

    # Every timeline file is a valid Chrome trace.
    timelines = sorted((out / "framework" / "pevents").rglob("*.json"))
    assert len(timelines) >= 2, timelines
    for path in timelines:
        assert chrome_trace_problems(path.read_text()) == [], path

    # ---- S3: every sealed file arrived, and smdebug reads from S3 what it reads from disk
    local_files = {str(p.relative_to(out)) for p in out.rglob("*")
                   if p.is_file() and not str(p.relative_to(out)).startswith(".")}
    remote = {k[len(prefix) + 1:] for k in s3.keys(prefix + "/")}
    assert remote == local_files, sorted(remote ^ local_files)
    url = s3.url(prefix)
    assert has_training_ended(url + "/system") and has_training_ended(url + "/framework")

    def key(e):
        return (e.event_phase, e.event_name, e.start_time, e.end_time, e.node_id,
                json.dumps(e.event_args, sort_keys=True))

    s3_framework = S3AlgorithmMetricsReader(url).get_events(*wide)
    assert collections.Counter(map(key, s3_framework)) == collections.Counter(map(key, framework))
    s3_system = S3SystemMetricsReader(url).get_events(*wide)
    assert sorted((e.timestamp, e.name, e.value) for e in s3_system) == sorted(
        (e.timestamp, e.name, e.value) for e in system)
    download = tmp_path / "s3-stats"
    download.mkdir()
    s3_stats = cProfileAnalysis(local_profile_dir=str(download), s3_path=url).fetch_profile_stats_by_step(
        PYTHON[0], PYTHON[0] + PYTHON[1])
    assert {f.function_name for f in s3_stats.function_stats_list} == functions
