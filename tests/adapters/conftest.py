"""Fixtures for the adapter tests: ``run_trainer(script, params=None, config=None,
env=None)`` runs ``script`` (a path) in a subprocess with the trainprof package, the built
library and a config of its own (see ``trainer_runs.run_script``), then the test reads its
output (the library allows one hook per process)."""

import pytest

from trainer_runs import run_script


@pytest.fixture
def run_trainer(tmp_path, hook_lib):
    counter = [0]

    def run(script, params=None, config=None, env=None, timeout=60):
        counter[0] += 1
        work = tmp_path / f"run{counter[0]}"
        work.mkdir()
        return run_script(work, script, hook_lib, params, config, env=env, timeout=timeout)

    return run
