"""trainprof.torch's logic without torch (the normal CI tier; the real thing is
tests/frameworks/torch, run by scripts/test-frameworks torch).

scripts/torch_fake.py trains a fake model (modules with forward hooks and named_modules,
like torch.nn.Module) from a fake loader that forks worker processes, with a fake
torch.profiler where asked; smdebug 1.0.34's LocalAlgorithmMetricsReader reads the timeline.
The loop: 3 epochs of 4 batches (global steps 0-11), 1 predict step (12), 2 eval steps (13-14).
"""

import collections
import importlib.util
import json
import pathlib

import pytest

if importlib.util.find_spec("torch") is not None:
    pytest.skip("torch is installed: the real adapter tier (tests/frameworks/torch) covers it", allow_module_level=True)

from smdebug.profiler.algorithm_metrics_reader import LocalAlgorithmMetricsReader  # noqa: E402
from smdebug_oracle import python_window_names, smdebug_pytorch_python_windows  # noqa: E402

SCRIPT = pathlib.Path(__file__).resolve().parent / "scripts" / "torch_fake.py"
CONFIG = {
    "DetailedProfilingConfig": {"StartStep": 5, "NumSteps": 3},
    "DataloaderProfilingConfig": {"StartStep": 3, "NumSteps": 3, "MetricsRegex": ".*DataLoaderIter"},
}
WINDOW = {5, 6, 7}
SUBMODULES = ["body", "body.0", "body.1", "fc1"]
OPS = ["aten::linear", "aten::linear", "aten::mse_loss_backward", "aten::relu"]
GETNEXT = "_MultiProcessingDataLoaderIter.DataLoaderIter::GetNext"
WANT_STEPS = [["train", s] for s in range(12)] + [["predict", 12], ["eval", 13], ["eval", 14]]


def read(run):
    return LocalAlgorithmMetricsReader(trace_root_folder=str(run.out)).get_events(0, 10**18)


def steps_of(events, phase):
    return collections.Counter(int(e.event_args["step_num"]) for e in events if e.event_phase == phase)


def by_step(events, phase, step):
    return sorted(e.event_name for e in events if e.event_phase == phase and e.event_args["step_num"] == str(step))


def check_common(run, events):
    m = run.manifest
    assert m["steps"] == WANT_STEPS
    assert m["stats"]["dropped_queue_full"] == 0 and m["stats"]["written"] == len(events)
    assert {e.event_args["pid"] for e in events} == {m["pid"]}  # nothing from the forked workers
    assert m["worker_status"] == [0] * 6
    assert m["hooks_after_attach"] == 2 and m["hooks_before_close"] == 2 and m["hooks_after_close"] == 0
    # Steps per mode, each ending where the next begins.
    assert steps_of(events, "Step:ModeKeys.TRAIN") == collections.Counter(range(12))
    assert steps_of(events, "Step:ModeKeys.PREDICT") == collections.Counter([0])
    assert steps_of(events, "Step:ModeKeys.EVAL") == collections.Counter([0, 1])
    steps = sorted((e for e in events if e.event_phase.startswith("Step:")), key=lambda e: e.start_time)
    assert all(a.end_time <= b.start_time for a, b in zip(steps, steps[1:]))
    # Dataloader: the batches of steps 3-5 and the iterator made while step 3 runs (for step 4).
    assert steps_of(events, "DataLoaderIter") == collections.Counter([3, 4, 5])
    assert {e.event_name for e in events if e.event_phase == "DataLoaderIter"} == {GETNEXT}
    init = [e for e in events if e.event_phase == "DataLoaderIterInitialize"]
    assert [
        (e.event_name, e.event_args["step_num"], e.event_args["num_workers"], e.event_args["pin_memory"]) for e in init
    ] == [("_MultiProcessingDataLoaderIter.__init__", "4", 2, True)]
    return {int(e.event_args["step_num"]): e for e in events if e.event_phase == "Step:ModeKeys.TRAIN"}


def test_steps_module_op_and_dataloader_events(run_trainer):
    run = run_trainer(SCRIPT, {}, config=CONFIG).check()
    assert run.warnings() == []
    m = run.manifest
    events = read(run)
    train = check_common(run, events)

    # The detailed window: module events and op events at exactly steps 5-7.
    assert steps_of(events, "Forward") == collections.Counter(WINDOW)
    for s in WINDOW:
        assert by_step(events, "Forward", s) == ["Net"]
        assert by_step(events, "Forward-SubModuleInternal", s) == SUBMODULES
        assert by_step(events, "cpu_functions", s) == OPS
        top = [e for e in events if e.event_phase == "Forward" and e.event_args["step_num"] == str(s)][0]
        assert train[s].start_time <= top.start_time <= top.end_time <= train[s].end_time
        subs = [
            e for e in events if e.event_phase == "Forward-SubModuleInternal" and e.event_args["step_num"] == str(s)
        ]
        assert all(top.start_time <= e.start_time <= e.end_time <= top.end_time for e in subs)
    assert set(steps_of(events, "cpu_functions")) == WINDOW
    ops = [e for e in events if e.event_phase == "cpu_functions"]
    assert all(train[5].start_time <= e.start_time and e.end_time <= train[8].start_time for e in ops)
    for e in ops:
        s = int(e.event_args["step_num"])
        assert train[s].start_time <= e.start_time <= train[s].end_time
        assert e.event_args["tid"] == (2 if e.event_name.endswith("_backward") else 1)
    assert not any(e.event_phase.startswith("gpu_functions") for e in events)
    # torch.profiler started once, stopped at the window's end; submodule hooks only inside it.
    assert m["profiler_starts"] == 1 and m["profiler_running_at_end"] is False
    assert m["max_hooks"] == 2 + 2 * len(SUBMODULES)


def test_cuda_kernels_become_gpu_functions_events(run_trainer):
    run = run_trainer(SCRIPT, {"cuda": True}, config=CONFIG).check()
    assert run.warnings() == []
    events = read(run)
    check_common(run, events)
    assert set(steps_of(events, "gpu_functions-dev:0")) == WINDOW
    launches = {
        (e.event_args["step_num"], e.start_time): e
        for e in events
        if e.event_phase == "cpu_functions" and e.event_name == "cudaLaunchKernel"
    }
    for s in WINDOW:
        assert by_step(events, "gpu_functions-dev:0", s) == [n + "_kernel" for n in OPS]
        assert by_step(events, "cpu_functions", s) == sorted(OPS + ["cudaLaunchKernel"] * 4)
    kernels = [e for e in events if e.event_phase == "gpu_functions-dev:0"]
    for e in kernels:
        a = e.event_args
        # At most 4 args besides pid and step_num (the library's limit).
        assert set(a) == {"pid", "step_num", "device", "stream", "correlation", "cpu_thread_start_time"}
        assert (a["device"], a["stream"]) == (0, 7)
        # The launch: the runtime call with the kernel's correlation id, found by that id (the
        # operators' own ids alias it and are never taken for it).
        launch = launches[(a["step_num"], a["cpu_thread_start_time"])]
        assert launch.event_args["tid"] in (1, 2)
        assert a["cpu_thread_start_time"] <= e.start_time
    assert len({e.event_args["correlation"] for e in kernels}) == len(kernels)


def test_a_collectives_message_comes_from_torchs_recorded_shapes(run_trainer):
    """docs/formats.md, "Collectives": the Python conversion writes a gloo range's bytes and
    c10's ScalarType number from its input's shape and type; the dispatcher's op, whose input
    is a TensorList without its type, keeps its thread only."""
    run = run_trainer(SCRIPT, {"collectives": True}, config=CONFIG).check()
    events = read(run)
    gloo = [e for e in events if e.event_phase == "cpu_functions" and e.event_name == "gloo:all_reduce"]
    calls = [e for e in events if e.event_phase == "cpu_functions" and e.event_name == "c10d::allreduce_"]
    assert {int(e.event_args["step_num"]) for e in gloo} == WINDOW and len(calls) == len(gloo)
    for e in gloo:
        assert (e.event_args["msg_bytes"], e.event_args["scalar_type"], e.event_args["tid"]) == (1089 * 4, 6, 3)
    assert all(set(e.event_args) == {"pid", "step_num", "tid"} for e in calls)


def test_device_ranges_of_record_function_are_marked_as_annotations(run_trainer):
    run = run_trainer(SCRIPT, {"cuda": True, "annotations": True}, config=CONFIG).check()
    assert run.warnings() == []
    gpu = [e for e in read(run) if e.event_phase == "gpu_functions-dev:0"]
    ranges = [e for e in gpu if e.event_name == "Optimizer.step#SGD.step"]
    assert len(ranges) == 3 * len(OPS) and len(gpu) == 6 * len(OPS)
    # No launch for a range; the kernels keep theirs.
    assert all(set(e.event_args) == {"pid", "step_num", "device", "stream", "correlation", "annotation"} for e in ranges)
    assert all(e.event_args["annotation"] == 1 for e in ranges)
    assert all("cpu_thread_start_time" in e.event_args for e in gpu if e not in ranges)


@pytest.mark.parametrize(
    "params, env, want",
    [
        ({"cuda": True}, {}, "1"),
        ({"cuda": True, "cuda_version": "13.0"}, {}, "1"),
        ({"cuda": True}, {"TEARDOWN_CUPTI": "0"}, "0"),  # the user's (or torch's own) choice stands
        ({"cuda": True, "cuda_version": "12.4"}, {}, None),  # teardown can crash CUDA graphs there
        ({"cuda": True, "cuda_version": None}, {}, None),
        ({}, {}, None),  # CPU only: CUPTI never attached
    ],
    ids=["cuda-12.8", "cuda-13.0", "user-set", "cuda-12.4", "no-cuda-build", "cpu-only"],
)
def test_the_detailed_window_leaves_cupti_detached(run_trainer, params, env, want):
    # Kineto (torch.profiler) leaves CUPTI attached after a trace with CUDA activities
    # unless TEARDOWN_CUPTI=1 is in the environment when the trace ends: the training
    # steps after the detailed window then run 10-20% slower for the rest of the run.
    env = {"TEARDOWN_CUPTI": None, **env}
    run = run_trainer(SCRIPT, params, config=CONFIG, env=env).check()
    assert run.warnings() == []
    check_common(run, read(run))
    assert run.manifest["profiler_starts"] == 1
    assert run.manifest["teardown_cupti_at_stop"] == [want]


@pytest.mark.parametrize(
    "params, warning",
    [
        ({"fake_profiler": False}, "torch.profiler cannot run here (ModuleNotFoundError"),
        ({"start_fails": True}, "torch.profiler cannot run here (RuntimeError: Profiler is already enabled"),
    ],
    ids=["no-torch", "profiler-busy"],
)
def test_without_torch_profiler_op_events_turn_off_with_one_warning(run_trainer, params, warning):
    run = run_trainer(SCRIPT, params, config=CONFIG).check()
    warnings = run.warnings()
    assert len(warnings) == 1 and warning in warnings[0], warnings
    events = read(run)
    check_common(run, events)
    assert steps_of(events, "Forward") == collections.Counter(WINDOW)
    assert steps_of(events, "cpu_functions") == collections.Counter()


def test_the_adapters_own_profiler_use_does_not_warn_the_user(run_trainer):
    # torch.profiler warns at every profile() that it "clears events at the end of each
    # cycle" (the fake says it as torch 2.4-2.10 does); the adapter's own profiler is not
    # the user's business, the user's own profiler still warns (the control).
    env = {"PYTHONWARNINGS": "always"}
    run = run_trainer(SCRIPT, {"user_profiler": True}, config=CONFIG, env=env).check()
    cycle = [line for line in run.proc.stderr.splitlines() if "Profiler clears events" in line]
    assert len(cycle) == 1 and "torch_fake.py" in run.proc.stderr, run.proc.stderr
    assert run.warnings() == []
    events = read(run)
    check_common(run, events)
    assert set(steps_of(events, "cpu_functions")) == WINDOW
    assert run.manifest["profiler_starts"] == 1


def test_features_can_be_turned_off(run_trainer):
    run = run_trainer(SCRIPT, {"attach_kwargs": {"module_events": False, "op_events": False}}, config=CONFIG).check()
    assert run.warnings() == []
    events = read(run)
    check_common(run, events)
    assert {e.event_phase for e in events} == {
        "Step:ModeKeys.TRAIN",
        "Step:ModeKeys.PREDICT",
        "Step:ModeKeys.EVAL",
        "DataLoaderIter",
        "DataLoaderIterInitialize",
    }
    assert run.manifest["profiler_starts"] == 0 and run.manifest["max_hooks"] == 2


def test_no_windows_configured_records_steps_only(run_trainer):
    run = run_trainer(SCRIPT, {}, config={}).check()
    assert run.warnings() == []
    events = read(run)
    assert collections.Counter(e.event_phase for e in events) == {
        "Step:ModeKeys.TRAIN": 12,
        "Step:ModeKeys.PREDICT": 1,
        "Step:ModeKeys.EVAL": 2,
    }
    assert run.manifest["profiler_starts"] == 0 and run.manifest["max_hooks"] == 2


def test_training_goes_on_without_the_library(run_trainer, tmp_path):
    run = run_trainer(SCRIPT, {}, config=CONFIG, env={"TRAINPROF_HOOK_LIB": tmp_path / "missing.so"}).check()
    warnings = run.warnings()
    assert len(warnings) == 1 and str(tmp_path / "missing.so") in warnings[0], warnings
    assert warnings[0].endswith("profiling is off in this process"), warnings
    m = run.manifest
    assert m["steps"] == [[mode, -1] for mode, _ in WANT_STEPS]  # nothing counted
    assert m["hooks_after_attach"] == 0 and m["worker_status"] == [0] * 6 and m["stats"] is None
    assert not run.out.exists()


# Train 0-9, eval at global steps 10-11, train again (its steps 10-11, global 12-13).
PLAN = [["train", 10], ["eval", 2], ["train", 2]]
PYTHON_WINDOW = {"StartStep": 9, "NumSteps": 3, "ProfilerName": "cProfile"}


def test_python_windows_are_named_by_mode_and_global_step_as_smdebug_names_them(run_trainer, tmp_path):
    """smdebug's PyTorch hook tests the Python window at its global step and names each
    window by the mode and that step: train-9, eval-10, eval-11 (not train-9, train-10,
    train-11, which the per-mode step would give)."""
    run = run_trainer(SCRIPT, {"plan": PLAN}, config={"PythonProfilingConfig": PYTHON_WINDOW}).check()
    assert run.warnings() == []
    assert run.manifest["steps"] == [[m, i] for i, m in enumerate(m for m, n in PLAN for _ in range(n))]
    got = python_window_names(run.out)
    want = smdebug_pytorch_python_windows(PYTHON_WINDOW, PLAN, tmp_path / "smdebug")
    assert want == [
        ("train-9-stepstart", "train-9-forwardpassend"),
        ("train-9-forwardpassend", "eval-10-stepstart"),
        ("eval-10-stepstart", "eval-10-forwardpassend"),
        ("eval-10-forwardpassend", "eval-11-stepstart"),
        ("eval-11-stepstart", "eval-11-forwardpassend"),
        ("eval-11-forwardpassend", "train-12-stepstart"),
    ]
    assert got == want
    # The step events keep smdebug's per-mode numbers.
    events = read(run)
    assert steps_of(events, "Step:ModeKeys.TRAIN") == collections.Counter(range(12))
    assert steps_of(events, "Step:ModeKeys.EVAL") == collections.Counter(range(2))


def test_detailed_window_opens_at_the_global_step_in_any_mode(run_trainer):
    """The detailed window at global steps 10-11 is the two eval steps: their Forward and
    op events, numbered per mode (Forward) and globally (ops), as smdebug numbers them."""
    config = {"DetailedProfilingConfig": {"StartStep": 10, "NumSteps": 2}}
    run = run_trainer(SCRIPT, {"plan": PLAN}, config=config).check()
    assert run.warnings() == []
    events = read(run)
    evals = {int(e.event_args["step_num"]): e for e in events if e.event_phase == "Step:ModeKeys.EVAL"}
    forward = [e for e in events if e.event_phase == "Forward"]
    assert steps_of(events, "Forward") == collections.Counter([0, 1])
    assert all(evals[int(e.event_args["step_num"])].start_time <= e.start_time for e in forward)
    assert set(steps_of(events, "cpu_functions")) == {10, 11}
    # The hook's own cost (docs/formats.md, "The hook's own cost"): the window's one open and
    # one close timed by the adapter, the steps by the package (one call each after the first).
    [record] = (run.out / "framework" / "cost").glob("*/*.json")
    parts = {p["Part"]: p for p in json.loads(record.read_text())["Parts"]}
    assert parts["window.detailed.open"]["Calls"] == 1 and parts["window.detailed.close"]["Calls"] == 1, parts
    assert parts["window.detailed.open"]["Seconds"] > 0 and parts["python.step"]["Calls"] >= 14, parts


def _untimed_events(events):
    """Every event without its times, in the order they began: (phase, name, step, args)."""
    keep = lambda args: tuple(sorted((k, str(v)) for k, v in args.items() if k not in ("pid", "tid")))  # noqa: E731
    ordered = sorted(events, key=lambda e: (e.start_time, e.event_phase, e.event_name, keep(e.event_args or {})))
    return [(e.event_phase, e.event_name, keep(e.event_args or {})) for e in ordered]


def test_step_next_gives_what_the_separate_calls_give(run_trainer):
    """trainprof_step_next (one library call per step after the first) against the
    separate calls (step_end, step_begin, the step-start boundary, the detailed question):
    the same events, the same detailed answers at each step, the same Python-stats folders,
    for train and eval steps with a Python window and the detailed window open."""
    config = {
        "PythonProfilingConfig": PYTHON_WINDOW,  # global steps 9-11: train-9, eval-10, eval-11
        "DetailedProfilingConfig": {"StartStep": 8, "NumSteps": 4},  # 8-11: train and eval
    }
    runs = {}
    for separate in (False, True):
        run = run_trainer(SCRIPT, {"plan": PLAN, "separate_calls": separate}, config=config).check()
        assert run.warnings() == []
        runs[separate] = run
    one, sep = runs[False], runs[True]
    n = sum(c for _, c in PLAN)
    assert one.manifest["step_next_calls"] == n - 1  # every step but the first
    assert sep.manifest["step_next_calls"] == 0
    assert one.manifest["steps"] == sep.manifest["steps"]
    assert one.manifest["detailed"] == sep.manifest["detailed"] == [8 <= s <= 11 for s in range(n)]
    assert python_window_names(one.out, steps_only=False) == python_window_names(sep.out, steps_only=False)
    assert len(python_window_names(one.out)) == 6
    a, b = read(one), read(sep)
    assert _untimed_events(a) == _untimed_events(b)
    assert steps_of(a, "Forward") == collections.Counter([8, 9, 0, 1])  # train 8, 9; eval 0, 1
    assert one.manifest["stats"]["written"] == sep.manifest["stats"]["written"] == len(a)
