"""Fixtures for the hook tests: a runner for the training scripts in tests/hook/scripts.

The library allows one hook per process (trainprof_init is idempotent, trainprof_shutdown
final), so every test runs its training script in a subprocess with its own config and
LocalPath, then reads the output back with smdebug 1.0.34 in the test process. The runner
itself is tests/trainer_runs.py, shared with the adapter tests.
"""

import pathlib

import pytest

from trainer_runs import run_script as _run_script

SCRIPTS = pathlib.Path(__file__).resolve().parent / "scripts"


@pytest.fixture
def run_script(tmp_path, hook_lib):
    """``run_script(name, params, config=..., top=..., env=..., pythonpath=...)`` runs
    ``tests/hook/scripts/<name>`` (see ``trainer_runs.run_script``)."""
    counter = [0]

    def run(name, params=None, config=None, top=None, env=None, timeout=60, pythonpath=None):
        counter[0] += 1
        work = tmp_path / f"run{counter[0]}"
        work.mkdir()
        return _run_script(work, SCRIPTS / name, hook_lib, params, config, top, env, timeout, pythonpath)

    return run
