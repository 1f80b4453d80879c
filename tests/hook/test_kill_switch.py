"""The kill switch: with TRAINPROF_DISABLE, under ``trainprof run --disable``, or without a
loadable library, a script using every entry point of the package runs as if trainprof
were not there (its own output, exit 0) with one warning line; ``strict=True`` raises."""

import json
import os
import subprocess
import sys

import pytest
from conftest import SCRIPTS
from trainer_runs import CLEARED_ENV, PACKAGE_DIR, package_messages

STEPS = ["step 0 total 0", "step 1 total 1", "step 2 total 3"]
ZERO_STATS = dict.fromkeys(
    ("dropped_queue_full", "dropped_writer", "written", "files_sealed", "open_failures", "dropped_names"), 0
)


def env_for(tmp_path, **extra):
    e = {k: v for k, v in os.environ.items() if k not in CLEARED_ENV and k != "TRAINPROF_HOOK_LIB"}
    e["PYTHONPATH"] = str(PACKAGE_DIR)
    e["PYTHONDONTWRITEBYTECODE"] = "1"
    e["SMPROFILER_CONFIG_PATH"] = str(tmp_path / "no-config.json")
    e["TRAINPROF_RESOURCE_CONFIG"] = str(tmp_path / "no-resourceconfig.json")
    # Where the library would write if it ran: nothing may appear there.
    e["TRAINPROF_LOCAL_PATH"] = str(tmp_path / "out")
    e.update({k: str(v) for k, v in extra.items()})
    return e


def check_plain_run(proc, tmp_path):
    assert proc.returncode == 0, f"exit {proc.returncode}\nstdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
    lines = proc.stdout.splitlines()
    assert lines[:3] == STEPS, proc.stdout
    assert lines[3] == "stats %s dropped 0 node None" % json.dumps(ZERO_STATS)
    assert lines[4:] == ["done"]
    warnings = package_messages(proc.stderr)
    assert len(warnings) == 1, proc.stderr
    assert [line for line in proc.stderr.splitlines() if line.startswith("trainprof-hook")] == [], proc.stderr
    assert "Traceback" not in proc.stderr
    assert not (tmp_path / "out").exists()
    return warnings[0]


def run_plain(tmp_path, env, params=None, argv=None):
    env = dict(env, TRAINPROF_TEST_PARAMS=json.dumps(params or {}))
    argv = argv or [sys.executable, str(SCRIPTS / "plain.py")]
    return subprocess.run(argv, env=env, cwd=str(tmp_path), capture_output=True, text=True, timeout=60)


def test_disabled_without_a_library_path(tmp_path):
    proc = run_plain(tmp_path, env_for(tmp_path, TRAINPROF_DISABLE="1"))
    warning = check_plain_run(proc, tmp_path)
    assert warning == "trainprof: profiling is off (TRAINPROF_DISABLE=1); the trainprof calls do nothing"


def test_trainprof_run_disable(tmp_path, trainprof_bin, hook_lib):
    # `run` passes TRAINPROF_HOOK_LIB from next to the binary, as it would with profiling on.
    assert hook_lib.parent == trainprof_bin.resolve().parent, "the library is not next to the binary"
    env = env_for(tmp_path)
    del env["TRAINPROF_LOCAL_PATH"]
    argv = [str(trainprof_bin), "run", "--disable", "--", sys.executable, str(SCRIPTS / "plain.py")]
    proc = run_plain(tmp_path, env, argv=argv)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[:3] == STEPS and lines[4:] == ["done"], proc.stdout
    # The agent logs with the same prefix: the package's own line comes once.
    warning = "trainprof: profiling is off (TRAINPROF_DISABLE=1); the trainprof calls do nothing"
    assert proc.stderr.splitlines().count(warning) == 1, proc.stderr
    assert "trainprof-hook" not in proc.stderr  # the library was not even loaded
    assert "Traceback" not in proc.stderr


@pytest.mark.parametrize("how", ["missing", "not_a_library"])
def test_no_loadable_library_is_one_warning(tmp_path, how):
    lib = tmp_path / "nowhere" / "libtrainprof_hook.so"
    if how == "not_a_library":
        lib = tmp_path / "libtrainprof_hook.so"
        lib.write_text("not an ELF file\n")
    proc = run_plain(tmp_path, env_for(tmp_path, TRAINPROF_HOOK_LIB=lib))
    warning = check_plain_run(proc, tmp_path)
    assert str(lib) in warning and warning.endswith("; profiling is off in this process")


def test_strict_raises_for_a_missing_library(tmp_path):
    lib = tmp_path / "nowhere" / "libtrainprof_hook.so"
    proc = run_plain(tmp_path, env_for(tmp_path, TRAINPROF_HOOK_LIB=lib), params={"strict": True})
    assert proc.returncode == 1
    assert "trainprof.LibraryError" in proc.stderr or "LibraryError" in proc.stderr
    assert str(lib) in proc.stderr
    assert proc.stdout == ""
