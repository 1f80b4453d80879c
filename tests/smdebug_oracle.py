"""smdebug 1.0.34 as the oracle for Python-profiling window names.

``smdebug_pytorch_python_windows`` drives smdebug's own ``ProfilerConfigParser`` and
``PythonProfiler`` with the calls its PyTorch hook (``smdebug/pytorch/hook.py``) makes for a
run of top-level forwards: the pre-step-zero window at start-up, then for every forward
``handle_step_start_python_profiling(mode, hook.step)`` in the forward pre-hook and
``handle_forward_pass_end_python_profiling(mode, hook.step)`` in the forward hook, where
``hook.step`` is its global step (every mode counted together, from 0); then the close.
smdebug writes real stats folders; their names, with the times cut off, are the answer.
``python_window_names`` cuts a trainprof output folder's names the same way.
"""

import json
import os
import pathlib

WINDOW_MODES = {"train", "eval", "predict", "global"}


def _untimed(name):
    """``train-9-stepstart-1795….5_eval-10-stepstart-1795….0`` -> ``("train-9-stepstart",
    "eval-10-stepstart")``."""
    start, end = name.split("_")
    return tuple(half.rsplit("-", 1)[0] for half in (start, end))


def python_window_names(out, framework="pytorch", profiler="cprofile", steps_only=True):
    """The windows under ``out``, untimed, in the order they started: only the step windows
    (neither pre-step-zero nor post-close) unless ``steps_only`` is false."""
    root = pathlib.Path(out) / "framework" / framework / profiler
    names = [p.name for p in root.glob("*/*") if p.is_dir()]
    names.sort(key=lambda n: float(n.split("_")[0].rsplit("-", 1)[1]))
    return [_untimed(n) for n in names if not steps_only or n.split("-", 1)[0] in WINDOW_MODES]


def smdebug_pytorch_python_windows(python_config, plan, work):
    """The windows smdebug 1.0.34's PyTorch hook writes for ``plan`` (``[[mode, count],
    ...]``) under a config whose ``PythonProfilingConfig`` is ``python_config`` (a dict);
    ``work`` is an empty folder of the caller's."""
    from smdebug.core.modes import ModeKeys
    from smdebug.core.utils import FRAMEWORK
    from smdebug.profiler.profiler_config_parser import ProfilerConfigParser

    work = pathlib.Path(work)
    work.mkdir(parents=True, exist_ok=True)
    out = work / "smdebug-out"
    config = work / "smdebug-profilerconfig.json"
    config.write_text(
        json.dumps(
            {"ProfilingParameters": {"LocalPath": str(out), "PythonProfilingConfig": json.dumps(python_config)}}
        )
    )
    old = os.environ.get("SMPROFILER_CONFIG_PATH")
    os.environ["SMPROFILER_CONFIG_PATH"] = str(config)
    try:
        parser = ProfilerConfigParser(FRAMEWORK.PYTORCH)
        assert parser.is_python_profiling_enabled(), "smdebug did not take the Python-profiling config"
        parser.start_pre_step_zero_python_profiling()
        step = -1  # smdebug's CallbackHook starts at init_step -1
        for mode, count in plan:
            for _ in range(count):
                step += 1
                parser.handle_step_start_python_profiling(ModeKeys[mode.upper()], step)
                parser.handle_forward_pass_end_python_profiling(ModeKeys[mode.upper()], step)
        parser.start_post_hook_close_python_profiling()
        parser.stop_post_hook_close_python_profiling()
    finally:
        if old is None:
            del os.environ["SMPROFILER_CONFIG_PATH"]
        else:
            os.environ["SMPROFILER_CONFIG_PATH"] = old
    return python_window_names(out)
