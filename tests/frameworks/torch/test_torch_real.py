"""trainprof.torch on a real PyTorch training run (the opt-in tier: scripts/test-frameworks torch).

scripts/train.py trains a tiny CNN for 3 epochs of 4 batches (global steps 0-11) from a
DataLoader with 2 worker processes, then evaluates 2 batches (global steps 12-13, eval steps
0-1), in a subprocess with its own config; smdebug 1.0.34's LocalAlgorithmMetricsReader reads
the timeline back. On a machine with CUDA the model runs there and the kernels must appear as
gpu_functions-dev:<n> events.
"""

import collections
import json
import os
import pathlib
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")
from smdebug.profiler.algorithm_metrics_reader import LocalAlgorithmMetricsReader  # noqa: E402
from smdebug.profiler.profiler_config_parser import MetricsCategory, ProfilerConfigParser  # noqa: E402
from smdebug_oracle import python_window_names  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parents[3]
PACKAGE_DIR = ROOT / "hook-ffi" / "python"
SCRIPT = pathlib.Path(__file__).resolve().parent / "scripts" / "train.py"
PLAN_SCRIPT = pathlib.Path(__file__).resolve().parent / "scripts" / "plan.py"

DETAILED = {"StartStep": 5, "NumSteps": 3}  # global steps 5, 6, 7
DATALOADER = {"StartStep": 3, "NumSteps": 3, "MetricsRegex": ".*DataLoaderIter"}  # 3, 4, 5
TRAIN_STEPS = 12
EVAL_STEPS = 2
SUBMODULES = {"conv1", "relu", "pool", "head", "head.0", "head.1"}
GETNEXT = "_MultiProcessingDataLoaderIter.DataLoaderIter::GetNext"
INIT = "_MultiProcessingDataLoaderIter.__init__"

_CLEARED_ENV = (
    "SMPROFILER_CONFIG_PATH",
    "TRAINPROF_LOCAL_PATH",
    "TRAINPROF_DISABLE",
    "TRAINPROF_QUEUE_EVENTS",
    "RANK",
    "PYTHONPATH",
)


def hook_lib():
    path = pathlib.Path(os.environ.get("TRAINPROF_HOOK_LIB") or ROOT / "target" / "debug" / "libtrainprof_hook.so")
    if not path.is_file():
        pytest.fail(f"{path} does not exist: build it first (`cargo build -p trainprof-hook`)")
    return path


def run_training(tmp_path, params, script=SCRIPT, env_extra=None, **subconfigs):
    out = tmp_path / "out"
    config = tmp_path / "profilerconfig.json"
    pp = {"LocalPath": str(out)}
    pp.update({k: json.dumps(v) for k, v in subconfigs.items()})
    config.write_text(json.dumps({"ProfilingParameters": pp}))
    manifest = tmp_path / "manifest.json"
    env = {k: v for k, v in os.environ.items() if k not in _CLEARED_ENV}
    env.update(
        PYTHONPATH=str(PACKAGE_DIR),
        TRAINPROF_HOOK_LIB=str(hook_lib()),
        SMPROFILER_CONFIG_PATH=str(config),
        TRAINPROF_RESOURCE_CONFIG=str(tmp_path / "no-resourceconfig.json"),
        TRAINPROF_TEST_MANIFEST=str(manifest),
        TRAINPROF_TEST_PARAMS=json.dumps(params),
        PYTHONDONTWRITEBYTECODE="1",
    )
    env.update(env_extra or {})
    proc = subprocess.run(
        [sys.executable, str(script)], env=env, cwd=str(tmp_path), capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, f"training failed ({proc.returncode})\n{proc.stdout}\n{proc.stderr}"
    return out, config, json.loads(manifest.read_text()), proc


def steps_of(events, phase):
    return collections.Counter(int(e.event_args["step_num"]) for e in events if e.event_phase == phase)


def test_real_training_run_read_back_by_smdebug(tmp_path, trainprof_bin):
    out, config, m, proc = run_training(
        tmp_path,
        {"epochs": 3, "batches": 4, "eval_batches": EVAL_STEPS, "num_workers": 2},
        DetailedProfilingConfig=DETAILED,
        DataloaderProfilingConfig=DATALOADER,
    )
    assert "trainprof:" not in proc.stderr, proc.stderr  # no adapter warning
    assert m["steps"] == [["train", s] for s in range(TRAIN_STEPS)] + [
        ["eval", TRAIN_STEPS + s] for s in range(EVAL_STEPS)
    ]
    assert m["stats"]["dropped_queue_full"] == 0 and m["stats"]["dropped_writer"] == 0

    # smdebug's own parser says the detailed window of this config is exactly steps 5-7.
    os.environ["SMPROFILER_CONFIG_PATH"] = str(config)
    try:
        parser = ProfilerConfigParser()
        window = {
            s
            for s in range(TRAIN_STEPS + EVAL_STEPS)
            if parser.should_save_metrics(MetricsCategory.DETAILED_PROFILING, s)
        }
    finally:
        del os.environ["SMPROFILER_CONFIG_PATH"]
    assert window == {5, 6, 7}

    events = LocalAlgorithmMetricsReader(trace_root_folder=str(out)).get_events(0, 10**18)
    assert len(events) == m["stats"]["written"]
    # Everything comes from the training process: the DataLoader's workers record nothing.
    assert {e.event_args["pid"] for e in events} == {m["pid"]}

    # Steps: one event per step and mode, numbered per mode.
    assert steps_of(events, "Step:ModeKeys.TRAIN") == collections.Counter(range(TRAIN_STEPS))
    assert steps_of(events, "Step:ModeKeys.EVAL") == collections.Counter(range(EVAL_STEPS))
    step_ev = {int(e.event_args["step_num"]): e for e in events if e.event_phase == "Step:ModeKeys.TRAIN"}

    # Module events: exactly the window's steps; the top module once per step, each submodule once.
    assert steps_of(events, "Forward") == collections.Counter(window)
    assert {e.event_name for e in events if e.event_phase == "Forward"} == {"Net"}
    for s in window:
        subs = [
            e.event_name
            for e in events
            if e.event_phase == "Forward-SubModuleInternal" and e.event_args["step_num"] == str(s)
        ]
        assert sorted(subs) == sorted(SUBMODULES), (s, subs)
        top = [e for e in events if e.event_phase == "Forward" and e.event_args["step_num"] == str(s)][0]
        assert step_ev[s].start_time <= top.start_time <= top.end_time <= step_ev[s].end_time

    # Op events: exactly the window's steps, forward and backward ops in each, all inside
    # the window's time (from step 5's begin to step 8's begin).
    ops = [e for e in events if e.event_phase == "cpu_functions"]
    assert set(steps_of(events, "cpu_functions")) == window
    for s in window:
        names = {e.event_name for e in ops if e.event_args["step_num"] == str(s)}
        assert {"aten::conv2d", "aten::linear"} <= names, (s, sorted(names)[:20])
        assert any("backward" in n.lower() for n in names), (s, sorted(names))
    lo, hi = step_ev[5].start_time, step_ev[8].start_time
    assert all(lo <= e.start_time and e.end_time <= hi for e in ops)
    assert all(isinstance(e.event_args["tid"], int) for e in ops)
    gpu = [e for e in events if e.event_phase.startswith("gpu_functions-dev:")]
    if m["device"] == "cuda":
        assert gpu and set(steps_of(events, "gpu_functions-dev:0")) <= window
        assert all(lo <= e.start_time for e in gpu)
        # The stream, the correlation id and the launch (the runtime call with the kernel's
        # correlation id) of each kernel: docs/formats.md, "Event vocabulary".
        kernels = [e for e in gpu if "annotation" not in e.event_args]
        assert all(isinstance(e.event_args.get("stream"), int) for e in kernels), kernels[0].event_args
        assert all(isinstance(e.event_args.get("correlation"), int) for e in kernels), kernels[0].event_args
        launched = [e for e in kernels if "cpu_thread_start_time" in e.event_args]
        assert len(launched) >= 0.9 * len(kernels), (len(launched), len(kernels), kernels[0].event_args)
        assert all(lo <= e.event_args["cpu_thread_start_time"] <= e.start_time for e in launched)
    else:
        assert gpu == []
    # The report explains the window (docs/report.md, "Detailed windows").
    rep = subprocess.run([str(trainprof_bin), "report", str(out), "--json"], capture_output=True, text=True, timeout=120)
    assert rep.returncode == 0, rep.stderr
    total = json.loads(rep.stdout)["detailed"]["total"]
    assert total["ops"] > 0 and total["top_ops"], total
    if m["device"] == "cuda":
        assert total["kernels"] > 0 and total["busy_pct"] > 0 and total["launch_delay"]["kernels"] > 0, total
        print("detailed:", total["sentence"])
    else:
        assert total["gpu"] is False and total["busy_pct"] is None

    # Dataloader: GetNext for the batches of steps 3-5 (fetched while steps 2-4 run), and the
    # second epoch's iterator (made while step 3 runs, so for step 4).
    dl = [e for e in events if e.event_phase == "DataLoaderIter"]
    assert {e.event_name for e in dl} == {GETNEXT}
    assert steps_of(events, "DataLoaderIter") == collections.Counter([3, 4, 5])
    init = [e for e in events if e.event_phase == "DataLoaderIterInitialize"]
    assert [
        (e.event_name, e.event_args["step_num"], e.event_args["num_workers"], e.event_args["pin_memory"]) for e in init
    ] == [(INIT, "4", 2, False)]

    kinds = collections.Counter(e.event_phase for e in events)
    print("\nevents per kind:", dict(sorted(kinds.items())), "device:", m["device"], "torch", m["torch"])
    print("training seconds:", round(m["seconds"], 2))


def test_profiling_off_outside_windows(tmp_path):
    """No windows configured: steps only, no torch.profiler, no module or dataloader events."""
    out, _, m, proc = run_training(tmp_path, {"epochs": 2, "batches": 3, "eval_batches": 1, "num_workers": 2})
    events = LocalAlgorithmMetricsReader(trace_root_folder=str(out)).get_events(0, 10**18)
    assert collections.Counter(e.event_phase for e in events) == {"Step:ModeKeys.TRAIN": 6, "Step:ModeKeys.EVAL": 1}
    assert "profiler_start" not in proc.stderr  # kineto never started


def test_example_train_torch_under_trainprof_run(tmp_path):
    """examples/train_torch.py as docs/trainer.md ("Framework adapters") shows it:
    under `trainprof run`, with an SDK-style config that opens the detailed, dataloader and
    Python windows; smdebug reads it back."""
    from smdebug.profiler.analysis.python_profile_analysis import cProfileAnalysis

    binary = pathlib.Path(os.environ.get("TRAINPROF_BIN") or ROOT / "target" / "debug" / "trainprof")
    out = tmp_path / "out"
    sdk = lambda d: "{" + "".join(f"{json.dumps(k)}: {json.dumps(v)}, " for k, v in d.items()) + "}"  # noqa: E731
    config = tmp_path / "profilerconfig.json"
    config.write_text(json.dumps({"ProfilingParameters": {
        "LocalPath": str(out),
        "DetailedProfilingConfig": sdk({"StartStep": 5, "NumSteps": 1}),
        "DataloaderProfilingConfig": sdk({"StartStep": 7, "NumSteps": 1, "MetricsRegex": ".*"}),
        "PythonProfilingConfig": sdk({"StartStep": 9, "NumSteps": 2, "ProfilerName": "cprofile"}),
    }}))
    env = {k: v for k, v in os.environ.items() if k not in _CLEARED_ENV}
    env.update(SMPROFILER_CONFIG_PATH=str(config), TRAINPROF_HOOK_LIB=str(hook_lib()),
               TRAIN_STEPS="20", EVAL_EVERY="10", EVAL_STEPS="2")
    example = ROOT / "examples" / "train_torch.py"
    proc = subprocess.run([str(binary), "run", "--s3", "", "--", sys.executable, str(example)],
                          env=env, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "step  20" in proc.stdout, proc.stdout

    events = LocalAlgorithmMetricsReader(str(out)).get_events(0, 10**18)
    by_phase = collections.defaultdict(set)
    for e in events:
        by_phase[e.event_phase].add(int(e.event_args.get("step_num", -1)))
    assert by_phase["Step:ModeKeys.TRAIN"] == set(range(20))
    assert by_phase["Step:ModeKeys.EVAL"] == set(range(4))  # 2 batches after steps 10 and 20
    assert by_phase["cpu_functions"] == {5}, dict(by_phase)  # global step 5: a train step
    assert by_phase["Forward"] == {5}, dict(by_phase)
    assert by_phase["DataLoaderIter"] == {7}, dict(by_phase)  # the batch fetched for step 7
    stats = cProfileAnalysis(local_profile_dir=str(out / "framework" / "pytorch" / "cprofile"))
    assert stats.list_profile_stats().shape[0] >= 4


# Train 0-9, eval at global steps 10-11, train again (its steps 10-11, global 12-13).
PLAN = [["train", 10], ["eval", 2], ["train", 2]]
PLAN_STEPS = [[m, i] for i, m in enumerate(m for m, n in PLAN for _ in range(n))]
PYTHON_WINDOW = {"StartStep": 9, "NumSteps": 3, "ProfilerName": "cProfile"}
WANT_WINDOWS = [
    ("train-9-stepstart", "train-9-forwardpassend"),
    ("train-9-forwardpassend", "eval-10-stepstart"),
    ("eval-10-stepstart", "eval-10-forwardpassend"),
    ("eval-10-forwardpassend", "eval-11-stepstart"),
    ("eval-11-stepstart", "eval-11-forwardpassend"),
    ("eval-11-forwardpassend", "train-12-stepstart"),
]


def test_python_windows_named_as_smdebugs_own_pytorch_hook_names_them(tmp_path):
    """The same steps through smdebug 1.0.34's PyTorch hook and through trainprof.torch:
    the same Python-profiling folders, by mode and global step (train-9, eval-10, eval-11),
    pre-step-zero and post-close included; only the times differ."""
    names = {}
    for hook in ("smdebug", "trainprof"):
        work = tmp_path / hook
        work.mkdir()
        out, _, m, proc = run_training(
            work, {"plan": PLAN, "hook": hook}, script=PLAN_SCRIPT, PythonProfilingConfig=PYTHON_WINDOW
        )
        assert m["steps"] == PLAN_STEPS, (hook, m["steps"])
        names[hook] = python_window_names(out, steps_only=False)
        print(f"\n{hook}:", [f"{a}_{b}" for a, b in names[hook]])
    assert [w for w in names["smdebug"] if w[0].split("-")[0] in ("train", "eval")] == WANT_WINDOWS
    assert names["trainprof"] == names["smdebug"]


def dynamo_lines(stderr):
    """Dynamo's graph-break and recompile log lines (TORCH_LOGS=graph_breaks,recompiles),
    and every warning line."""
    return [
        line
        for line in stderr.splitlines()
        if "[__graph_breaks]" in line or "[__recompiles]" in line or "Warning" in line
    ]


@pytest.mark.parametrize("placement", ["outer", "inner"])
def test_torch_compile_no_graph_break_from_trainprof(tmp_path, placement):
    """torch.compile with the hook attached to the compiled module (outer) or to the model
    that is then compiled (inner), over the plan above with the detailed and Python windows
    at global steps 9-11: Dynamo logs no graph break (the model has none of its own, so
    any would be trainprof's) and no warning; steps, Forward, op events and the Python
    windows come out as without torch.compile. Submodule events do not (docs/trainer.md)."""
    out, _, m, proc = run_training(
        tmp_path,
        {"plan": PLAN, "compile": placement},
        script=PLAN_SCRIPT,
        env_extra={"TORCH_LOGS": "graph_breaks,recompiles"},
        DetailedProfilingConfig={"StartStep": 9, "NumSteps": 3},
        PythonProfilingConfig=PYTHON_WINDOW,
    )
    lines = dynamo_lines(proc.stderr)
    print(f"\n{placement}: {len(lines)} dynamo lines")
    for line in lines:
        print("  ", line[:300])
    assert not [line for line in lines if "Graph break" in line], lines
    assert not [line for line in lines if "trainprof" in line or "Warning" in line], lines
    assert "trainprof:" not in proc.stderr, proc.stderr[-3000:]
    assert m["steps"] == PLAN_STEPS

    events = LocalAlgorithmMetricsReader(trace_root_folder=str(out)).get_events(0, 10**18)
    assert steps_of(events, "Step:ModeKeys.TRAIN") == collections.Counter(range(12))
    assert steps_of(events, "Step:ModeKeys.EVAL") == collections.Counter(range(2))
    # Forward events: numbered per mode, at global steps 9 (train 9), 10-11 (eval 0-1).
    forward = sorted((e.event_name, int(e.event_args["step_num"]), e.start_time) for e in events if e.event_phase == "Forward")
    assert [(n, s) for n, s, _ in sorted(forward, key=lambda f: f[2])] == [("Net", 9), ("Net", 0), ("Net", 1)]
    # Op events: numbered by global step, each step of the window has some.
    assert set(steps_of(events, "cpu_functions")) == {9, 10, 11}
    assert python_window_names(out) == WANT_WINDOWS
    kinds = collections.Counter(e.event_phase for e in events)
    print("events per kind:", dict(sorted(kinds.items())))
