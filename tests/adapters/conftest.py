"""Fixtures for the adapter tests: run a training script in a subprocess with the trainprof
package on PYTHONPATH, the built library and a config of its own, then read its output in
the test process (the library allows one hook per process).

``run_trainer(script, params=None, config=None, env=None)`` runs ``script`` (a path) with
``TRAINPROF_TEST_PARAMS`` (JSON) and ``TRAINPROF_TEST_MANIFEST`` set; ``config`` is the
``ProfilingParameters`` object (sub-configs as dicts, written as the strings SageMaker
writes) and gets ``LocalPath`` = ``<run>/out`` (``Run.out``). Without ``config`` the run
has no config file (profiling off)."""

import json
import os
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
PACKAGE_DIR = ROOT / "hook-ffi" / "python"

# Environment that would change what the hook does: cleared so that a run depends only on
# what the test sets.
_CLEARED_ENV = (
    "SMPROFILER_CONFIG_PATH",
    "TRAINPROF_LOCAL_PATH",
    "TRAINPROF_DISABLE",
    "TRAINPROF_INTERVAL_MS",
    "TRAINPROF_QUEUE_EVENTS",
    "TRAINPROF_SHUTDOWN_TIMEOUT_MS",
    "TRAINPROF_RESOURCE_CONFIG",
    "RANK",
    "OMPI_COMM_WORLD_RANK",
    "PMI_RANK",
    "MV2_COMM_WORLD_RANK",
    "SLURM_PROCID",
    "PYTHONPATH",
)


class Run:
    """The outcome of one script run."""

    def __init__(self, proc, out, manifest_path):
        self.proc = proc
        self.out = out  # LocalPath
        self.manifest_path = manifest_path

    @property
    def manifest(self):
        assert self.manifest_path.is_file(), f"the script wrote no manifest; stderr:\n{self.proc.stderr}"
        return json.loads(self.manifest_path.read_text())

    def check(self):
        assert self.proc.returncode == 0, (
            f"script failed with {self.proc.returncode}\nstdout:\n{self.proc.stdout}\nstderr:\n{self.proc.stderr}"
        )
        return self

    def warnings(self):
        """The package's one-line warnings (``trainprof: ...``) on stderr."""
        return [line for line in self.proc.stderr.splitlines() if line.startswith("trainprof: ")]


@pytest.fixture(scope="session")
def hook_lib() -> pathlib.Path:
    path = pathlib.Path(os.environ.get("TRAINPROF_HOOK_LIB") or ROOT / "target" / "debug" / "libtrainprof_hook.so")
    if not path.is_file():
        pytest.fail(f"{path} does not exist: build it first (`cargo build -p trainprof-hook`; scripts/test does)")
    return path.resolve()


@pytest.fixture
def run_trainer(tmp_path, hook_lib):
    counter = [0]

    def run(script, params=None, config=None, env=None, timeout=60):
        counter[0] += 1
        work = tmp_path / f"run{counter[0]}"
        work.mkdir()
        out = work / "out"
        manifest = work / "manifest.json"
        e = {k: v for k, v in os.environ.items() if k not in _CLEARED_ENV}
        e["PYTHONPATH"] = str(PACKAGE_DIR)
        e["TRAINPROF_HOOK_LIB"] = str(hook_lib)
        e["TRAINPROF_RESOURCE_CONFIG"] = str(work / "no-resourceconfig.json")
        e["TRAINPROF_TEST_MANIFEST"] = str(manifest)
        e["TRAINPROF_TEST_PARAMS"] = json.dumps(params or {})
        e["PYTHONDONTWRITEBYTECODE"] = "1"
        if config is not None:
            pp = {"LocalPath": str(out)}
            pp.update({k: json.dumps(v) if isinstance(v, dict) else v for k, v in config.items()})
            path = work / "profilerconfig.json"
            path.write_text(json.dumps({"ProfilingParameters": pp}))
            e["SMPROFILER_CONFIG_PATH"] = str(path)
        else:
            e["SMPROFILER_CONFIG_PATH"] = str(work / "no-config.json")
        for k, v in (env or {}).items():
            if v is None:
                e.pop(k, None)
            else:
                e[k] = str(v)
        proc = subprocess.run(
            [sys.executable, str(script)], env=e, cwd=str(work), capture_output=True, text=True, timeout=timeout
        )
        return Run(proc, out, manifest)

    return run
