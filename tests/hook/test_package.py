"""The trainprof package itself: imports, library lookup and errors, argument checking,
disabled profiling, fork()ed children, and the C ABI's statuses through ctypes."""

import collections
import json
import os
import re
import shutil
import subprocess
import sys
import warnings

import pytest
from smdebug.profiler.algorithm_metrics_reader import LocalAlgorithmMetricsReader
from test_python_profiling import SMDEBUG_PYTORCH_WINDOWS

from test_header import lib_module

# The statuses, as the package defines them (checked against trainprof_hook.h by test_header.py).
_lib = lib_module()
OK, NOT_INITIALIZED, SHUT_DOWN, DISABLED, FORKED_CHILD, NO_STEP = (
    _lib.STATUS_OK,
    _lib.STATUS_NOT_INITIALIZED,
    _lib.STATUS_SHUT_DOWN,
    _lib.STATUS_DISABLED,
    _lib.STATUS_FORKED_CHILD,
    _lib.STATUS_NO_STEP,
)
NULL_ARGUMENT, INVALID_UTF8, INVALID_ARGUMENT, INTERNAL, BUFFER_TOO_SMALL = (
    _lib.STATUS_NULL_ARGUMENT,
    _lib.STATUS_INVALID_UTF8,
    _lib.STATUS_INVALID_ARGUMENT,
    _lib.STATUS_INTERNAL,
    _lib.STATUS_BUFFER_TOO_SMALL,
)

PYTHON_WINDOWS = {"PythonProfilingConfig": {"StartStep": 2, "NumSteps": 2, "ProfilerName": "cProfile"}}


def fake_frameworks(root):
    """torch and tensorflow packages that only say they were imported."""
    for name in ("torch", "tensorflow"):
        (root / name).mkdir(parents=True)
        (root / name / "__init__.py").write_text("IMPORTED_BY_TRAINPROF_TEST = True\n")
    return root


def test_import_pulls_in_no_framework_and_no_library(run_script, tmp_path, package_dir):
    fakes = fake_frameworks(tmp_path / "fakes")
    run = run_script("api.py", {"case": "import"}, pythonpath=f"{package_dir}{os.pathsep}{fakes}").check()
    m = run.manifest
    assert m["torch"] is False and m["tensorflow"] is False, m["new_modules"]
    assert not any(n.split(".")[0] in ("torch", "tensorflow", "pyinstrument", "smdebug") for n in m["new_modules"])
    assert m["library_mapped"] is False and m["loaded"] == 0
    assert "trainprof" in m["new_modules"]
    # The fake packages are importable in that environment: had trainprof imported them, it would show.
    check = subprocess.run(
        [sys.executable, "-c", "import torch, tensorflow; print(torch.IMPORTED_BY_TRAINPROF_TEST)"],
        env={**os.environ, "PYTHONPATH": str(fakes)},
        capture_output=True,
        text=True,
    )
    assert check.stdout.strip() == "True", check.stderr


def error_of(run):
    profiler = run.check().manifest["profiler"]
    assert "error" in profiler, f"Profiler() worked: {profiler}"
    return profiler


def test_wrong_library_path_is_a_clear_error(run_script, tmp_path, package_dir):
    """With strict=True; without it the same message is one warning (test_kill_switch.py)."""
    missing = tmp_path / "nowhere" / "libtrainprof_hook.so"
    e = error_of(run_script("api.py", {"case": "load", "strict": True}, env={"TRAINPROF_HOOK_LIB": missing}))
    assert e["import_error"] and e["error"] == "LibraryError"
    assert str(missing) in e["message"] and "TRAINPROF_HOOK_LIB" in e["message"]
    assert str(package_dir / "trainprof" / "libtrainprof_hook.so") in e["message"]

    not_a_library = tmp_path / "libtrainprof_hook.so"
    not_a_library.write_text("not an ELF file\n")
    e = error_of(run_script("api.py", {"case": "load", "strict": True}, env={"TRAINPROF_HOOK_LIB": not_a_library}))
    assert e["import_error"] and str(not_a_library) in e["message"] and "cannot load" in e["message"]

    # Not set: the package's own directory, here a copy of the package without a library.
    copy = tmp_path / "pkg"
    shutil.copytree(package_dir / "trainprof", copy / "trainprof", ignore=shutil.ignore_patterns("*.so"))
    e = error_of(
        run_script("api.py", {"case": "load", "strict": True}, env={"TRAINPROF_HOOK_LIB": None}, pythonpath=copy)
    )
    assert e["import_error"]
    assert str(copy / "trainprof" / "libtrainprof_hook.so") in e["message"] and "TRAINPROF_HOOK_LIB" in e["message"]


def test_abi_mismatch_is_refused(run_script):
    e = error_of(run_script("api.py", {"case": "abi", "strict": True}))
    assert e["import_error"] and "ABI version 3" in e["message"] and "needs 4" in e["message"]
    # Not strict: one warning, and a profiler that does nothing.
    run = run_script("api.py", {"case": "abi"}, config={}).check()
    assert run.manifest["profiler"] == {"ok": "<trainprof.Profiler framework=pytorch status=DISABLED>"}
    assert [w for w in run.warnings() if "ABI version 3" in w and "needs 4" in w] == run.warnings()
    assert len(run.warnings()) == 1


def test_programmer_mistakes_raise_value_error(run_script):
    run = run_script("api.py", {"case": "errors"}, config={}).check()
    m = run.manifest
    assert m["init_status"] == OK
    for case in (
        "framework",
        "mode",
        "negative_step",
        "feature",
        "dataloader_without_name",
        "five_args",
        "string_arg",
        "name_not_str",
        "nul_in_name",
        "end_before_start",
        "nan_time",
        "int64_overflow",
    ):
        assert m[case].get("error") == "ValueError", (case, m[case])
    assert (m["step"], m["next_step"], m["eval_step"]) == (7, 8, 0)
    assert m["step_end_twice"] == {"ok": "None"}  # NO_STEP: a warning, not an exception
    # A TrainprofWarning, pointing at the call that made the mistake.
    assert "trainprof: step_end() without step_begin(); ignored" in run.warnings()
    assert re.search(r"^\S*api\.py:\d+: TrainprofWarning: step_end\(\) without", run.proc.stderr, re.M), run.proc.stderr
    assert m["close_twice"] == {"ok": "None"}
    assert m["registered_names"] == ["Forward", "Net", "a", "b", "c", "d"]  # no rejected name got in

    events = LocalAlgorithmMetricsReader(trace_root_folder=str(run.out)).get_events(0, 10**18)
    assert sorted((e.event_phase, e.event_name, e.event_args["step_num"]) for e in events) == [
        ("Forward", "Net", "0"),
        ("Step:ModeKeys.EVAL", "Step:ModeKeys.EVAL", "0"),
    ]
    fwd = next(e for e in events if e.event_name == "Net")
    assert {k: fwd.event_args[k] for k in "abcd"} == {"a": -(2**63), "b": False, "c": 1e300, "d": 3}
    assert m["stats"]["written"] == 2


def test_names_over_the_limit_are_dropped_and_counted(run_script):
    run = run_script("api.py", {"case": "names"}, config={}, env={"TRAINPROF_MAX_NAMES": 16}).check()
    m = run.manifest
    # 16 names: the 4 step names, "Forward" and name-0..name-10; the other 89 events dropped.
    assert m["stats"]["written"] == 11 and m["stats"]["dropped_names"] == 89 and m["dropped"] == 89
    assert m["cached_names"] == 12  # the package caches no name the library refused
    # Once the library said the table is full, no new name costs a call into it.
    assert m["register_calls"] == 12 + 1, m["register_calls"]  # the 12 cached, then one refusal
    assert [w for w in run.warnings() if "name table is full" in w] == run.warnings()
    assert len(run.warnings()) == 1
    assert run.proc.stderr.count("the name table is full") == 2  # the library's log line and the warning
    events = LocalAlgorithmMetricsReader(trace_root_folder=str(run.out)).get_events(0, 10**18)
    assert sorted(e.event_name for e in events) == sorted("name-%d" % i for i in range(11))


@pytest.mark.parametrize("how", ["DisableProfiler", "TRAINPROF_DISABLE"])
def test_disabled_profiling_writes_nothing(run_script, how):
    config = {"RotateMaxFileSizeInBytes": 1500, "DetailedProfilingConfig": {"StartStep": 1}, **PYTHON_WINDOWS}
    params = {"phases": [["train", 4], ["eval", 2]]}
    if how == "DisableProfiler":
        run = run_script("loop.py", params, config=config, top={"DisableProfiler": True})
    else:
        run = run_script("loop.py", params, config=config, env={"TRAINPROF_DISABLE": "1"})
    m = run.check().manifest
    assert m["init_status"] == DISABLED
    assert m["node_id"] is None
    assert m["steps"] == [["train", s] for s in range(4)] + [["eval", s] for s in range(2)]
    assert not any(a[f] for a in m["active"] for f in ("detailed", "dataloader", "python", "smdataparallel"))
    assert m["stats"] == dict.fromkeys(
        ("dropped_queue_full", "dropped_writer", "written", "files_sealed", "open_failures", "dropped_names"), 0
    )
    files = [os.path.join(d, f) for d, _, fs in os.walk(run.out) for f in fs]
    assert files == []
    assert "Traceback" not in run.proc.stderr


def test_forked_child_is_inert(run_script):
    """A child forked inside a Python-profiling window keeps calling the profiler and exits
    with os._exit(0): it records nothing, writes no stats, and the parent's files are whole."""
    run = run_script(
        "loop.py",
        {"phases": [["train", 5]], "fork_at": ["train", 2]},
        config={"RotateMaxFileSizeInBytes": 1500, **PYTHON_WINDOWS},
    ).check()
    m = run.manifest
    assert m["child_exit_status"] == 0
    assert m["parent_profiler_running_at_fork"] is True  # the fork happened inside a window
    c = json.loads((run.manifest_path.parent / "manifest.json.child.json").read_text())
    assert c["pid"] != m["pid"]
    assert c["profiler_running"] is False  # the inherited cProfile profiler was switched off
    assert (c["step_begin"], c["forward_end"], c["step_end"], c["close"]) == (None, None, None, None)
    assert c["active"] == [False, False, False, False]
    assert c["stats"] is None and c["node_id"] is None
    assert c["lib"] == {
        "step_begin": FORKED_CHILD,
        "record": FORKED_CHILD,
        "python_boundary": FORKED_CHILD,
        "python_boundary_ended": 0,
        "python_boundary_started": 0,
        "step_next": [FORKED_CHILD, -1, 0, 0],
        "shutdown": FORKED_CHILD,
        "init": FORKED_CHILD,
    }

    # The parent: all its events, none of the child's, in sealed files.
    events = LocalAlgorithmMetricsReader(trace_root_folder=str(run.out)).get_events(0, 10**18)
    got = collections.Counter((e.event_phase, e.event_name, e.event_args.get("step_num")) for e in events)
    want = collections.Counter((e["phase"], e["name"], str(e["step"])) for e in m["events"])
    assert got == want
    assert {e.event_args["pid"] for e in events} == {m["pid"]}
    leftovers = [os.path.join(d, n) for d, ds, fs in os.walk(run.out) for n in ds + fs if n.endswith(".tmp")]
    assert leftovers == []

    # Exactly the parent's windows; the child added none (it shares the parent's node id).
    root = run.out / "framework" / "pytorch" / "cprofile"
    assert os.listdir(root) == [m["node_id"]]
    windows = {"_".join("-".join(h.split("-")[:3]) for h in d.split("_")) for d in os.listdir(root / m["node_id"])}
    assert windows == SMDEBUG_PYTORCH_WINDOWS


def test_c_abi_statuses_through_ctypes(run_script):
    run = run_script("abi.py", config={}).check()
    assert run.proc.stdout.strip() == "still alive"
    m = run.manifest
    assert m["abi_version"] == 3 and m["version"] == "0.1.0"
    assert m["before_init"] == {
        "register_name": NOT_INITIALIZED,
        "step_begin": NOT_INITIALIZED,
        "step_end": NOT_INITIALIZED,
        "record": NOT_INITIALIZED,
        "shutdown": NOT_INITIALIZED,
        "python_boundary": NOT_INITIALIZED,
        "dropped": 0,
    }
    assert (m["init_null"], m["init_bad_utf8"], m["init_unknown_framework"]) == (
        NULL_ARGUMENT,
        INVALID_UTF8,
        INVALID_ARGUMENT,
    )
    assert (m["init"], m["init_again"]) == (OK, OK)
    assert m["null"] == dict.fromkeys(m["null"], NULL_ARGUMENT) and len(m["null"]) == 8
    assert m["utf8"] == {"register_name": INVALID_UTF8, "window_active_dataloader": INVALID_UTF8}
    assert m["invalid"] == dict.fromkeys(m["invalid"], INVALID_ARGUMENT) and len(m["invalid"]) == 7
    assert m["node_id_small_buffer"] == BUFFER_TOO_SMALL
    assert m["step_end_without_step"] == NO_STEP
    assert (m["selftest_panic"], m["selftest_panic_again"]) == (INTERNAL, INTERNAL)
    assert m["after_panic"] == {"step_begin": OK, "step": 0, "record": OK, "step_end": OK, "shutdown": OK}
    assert m["written"] == 2
    assert m["after_shutdown"] == {"record": SHUT_DOWN, "init": SHUT_DOWN, "shutdown": SHUT_DOWN}
    # trainprof_step_next when it does nothing: the "nothing" out-values (none written for
    # a NULL pointer), and no step begun (after_panic's first step is step 0).
    nothing = [-1, 0, 0, 0]
    assert m["step_next"] == {
        "before_init": [NOT_INITIALIZED, *nothing],
        "null": [[NULL_ARGUMENT, 77, 77, 77, 77]] * 3,
        "invalid_mode": [INVALID_ARGUMENT, *nothing],
        "after_shutdown": [SHUT_DOWN, *nothing],
    }
    # The caught panic is one log line, not a Rust panic message with a backtrace hint.
    assert "panicked at" not in run.proc.stderr
    assert run.proc.stderr.count("internal error") == 2, run.proc.stderr


def test_unwritable_local_path_never_reaches_the_loop(run_script, tmp_path):
    """Stats and timelines cannot be written (LocalPath lies under a regular file): the loop
    finishes, the package says so in one line, the hook counts what it dropped."""
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    run = run_script(
        "loop.py",
        {"phases": [["train", 5]], "local_path": str(blocker / "out")},
        config={"FileOpenFailThreshold": 2, **PYTHON_WINDOWS},
        env={"TRAINPROF_LOCAL_PATH": blocker / "out"},
    ).check()
    m = run.manifest
    assert m["init_status"] == OK
    warnings = run.warnings()
    assert len(warnings) == 1 and "cannot write cProfile stats" in warnings[0], run.proc.stderr
    assert m["stats"]["written"] == 0 and m["stats"]["open_failures"] >= 1
    assert m["dropped"] == len(m["events"]) == m["stats"]["dropped_writer"]
    assert "Traceback" not in run.proc.stderr


def test_exit_without_close_seals_everything(run_script):
    """A loop that never calls close(): the atexit handler closes the profiler (sealing
    the last timeline file) and the post-close window ends at exit."""
    run = run_script(
        "loop.py",
        {"phases": [["train", 5]], "close": False},
        config={"RotateMaxFileSizeInBytes": 1500, **PYTHON_WINDOWS},
    ).check()
    m = run.manifest
    events = LocalAlgorithmMetricsReader(trace_root_folder=str(run.out)).get_events(0, 10**18)
    # Everything, including the event recorded where the loop would have closed.
    assert len(events) == len(m["events"]) + 1 and sum(e.event_name == "AfterClose" for e in events) == 1
    leftovers = [os.path.join(d, n) for d, ds, fs in os.walk(run.out) for n in ds + fs if n.endswith(".tmp")]
    assert leftovers == []
    root = run.out / "framework" / "pytorch" / "cprofile" / m["node_id"]
    windows = {"_".join("-".join(h.split("-")[:3]) for h in d.split("_")) for d in os.listdir(root)}
    assert "prestepzero-*-end_posthookclose-*-end" in windows and len(windows) == 6, windows


@pytest.mark.parametrize("config", ["missing", "no ProfilingParameters", "ProfilingParameters {}", "ProfilingParameters not an object"])
def test_no_framework_config_writes_nothing(run_script, tmp_path, config):
    # As smdebug: without a (non-empty) ProfilingParameters object the hook records nothing.
    # LocalPath is then the default /opt/ml/output/profiler, so the proof is the init
    # status and the log line, not an empty folder.
    if config == "missing":
        run = run_script("loop.py", {"phases": [["train", 3]]})
    else:
        doc = {
            "no ProfilingParameters": {},
            "ProfilingParameters {}": {"ProfilingParameters": {}},
            "ProfilingParameters not an object": {"ProfilingParameters": "x"},
        }[config]
        path = tmp_path / "profilerconfig.json"
        path.write_text(json.dumps(doc))
        run = run_script("loop.py", {"phases": [["train", 3]]}, env={"SMPROFILER_CONFIG_PATH": path})
    run.check()
    assert run.manifest["init_status"] == 3  # TRAINPROF_STATUS_DISABLED
    assert "no ProfilingParameters" in run.proc.stderr
    assert run.manifest["stats"]["written"] == 0


def test_local_path_override_records_without_a_config(run_script, tmp_path):
    out = tmp_path / "out"
    run = run_script("loop.py", {"phases": [["train", 3]]}, env={"TRAINPROF_LOCAL_PATH": out})
    run.check()
    assert run.manifest["init_status"] == 0
    files = [os.path.join(d, f) for d, _, fs in os.walk(out / "framework" / "pevents") for f in fs]
    assert files and all(f.endswith("_pythontimeline.json") for f in files)


def test_the_package_compiles_with_warnings_as_errors(package_dir):
    # An invalid escape in a docstring is a SyntaxWarning at every import under Python 3.12
    # (a DeprecationWarning before), a SyntaxError under -W error.
    files = sorted((package_dir / "trainprof").rglob("*.py"))
    assert len(files) >= 5, files
    for path in files:
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            compile(path.read_bytes(), str(path), "exec", dont_inherit=True)
    # And as a user would run it, importing every module of the package.
    names = ["trainprof"] + ["trainprof." + p.stem for p in files if p.stem != "__init__"]
    subprocess.run(
        [sys.executable, "-W", "error", "-B", "-c", "import " + ", ".join(names)],
        env={**os.environ, "PYTHONPATH": str(package_dir)},
        check=True,
    )
