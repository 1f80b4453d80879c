"""Running a training script in a subprocess with the trainprof package and the built
library, for the hook tests (tests/hook) and the adapter tests (tests/adapters).

The library allows one hook per process (trainprof_init is idempotent, trainprof_shutdown
final), so every run gets its own process, config and LocalPath; the test process reads the
output back with smdebug 1.0.34.
"""

import json
import os
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
PACKAGE_DIR = ROOT / "hook-ffi" / "python"

# Environment that would change what the hook does (config, node id, output): cleared so
# that every run depends only on what the test sets.
CLEARED_ENV = (
    "SMPROFILER_CONFIG_PATH",
    "TRAINPROF_LOCAL_PATH",
    "TRAINPROF_DISABLE",
    "TRAINPROF_INTERVAL_MS",
    "TRAINPROF_QUEUE_EVENTS",
    "TRAINPROF_MAX_NAMES",
    "TRAINPROF_SHUTDOWN_TIMEOUT_MS",
    "TRAINPROF_RESOURCE_CONFIG",
    "RANK",
    "OMPI_COMM_WORLD_RANK",
    "PMI_RANK",
    "MV2_COMM_WORLD_RANK",
    "SLURM_PROCID",
    "PYTHONPATH",
)


def profiler_config(local_path, **params):
    """A SageMaker profiler config: ``ProfilingParameters`` with ``LocalPath`` and
    ``params``; dict values (sub-configs) become the strings SageMaker writes."""
    pp = {"LocalPath": str(local_path)}
    for key, value in params.items():
        pp[key] = json.dumps(value) if isinstance(value, dict) else value
    return {"ProfilingParameters": pp}


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
        """What the package told the user on stderr, each as ``trainprof: <message>``: its
        log lines (``trainprof: ...``) and its ``TrainprofWarning`` s (``<file>:<line>:
        TrainprofWarning: <message>``, docs/python.md, "Messages")."""
        return package_messages(self.proc.stderr)


def package_messages(stderr):
    """The package's messages in ``stderr`` (see ``Run.warnings``)."""
    out = []
    for line in stderr.splitlines():
        if line.startswith("trainprof: "):
            out.append(line)
        elif ": TrainprofWarning: " in line:
            out.append("trainprof: " + line.split(": TrainprofWarning: ", 1)[1])
    return out


def run_script(work, script, hook_lib, params=None, config=None, top=None, env=None, timeout=60, pythonpath=None):
    """Runs ``script`` in ``work`` with ``TRAINPROF_TEST_PARAMS`` (JSON) and
    ``TRAINPROF_TEST_MANIFEST`` set and the package on ``PYTHONPATH``.
    ``SMPROFILER_CONFIG_PATH`` names a config written into ``work``: ``ProfilingParameters``
    = ``config`` (sub-configs as dicts) with ``LocalPath`` = ``<work>/out`` (``Run.out``),
    plus the top-level keys in ``top``; without ``config`` there is no config file
    (profiling off). ``env`` values of None remove a variable."""
    out = work / "out"
    manifest = work / "manifest.json"
    e = {k: v for k, v in os.environ.items() if k not in CLEARED_ENV}
    e["PYTHONPATH"] = str(pythonpath or PACKAGE_DIR)
    e["TRAINPROF_HOOK_LIB"] = str(hook_lib)
    e["TRAINPROF_RESOURCE_CONFIG"] = str(work / "no-resourceconfig.json")
    e["TRAINPROF_TEST_MANIFEST"] = str(manifest)
    e["TRAINPROF_TEST_PARAMS"] = json.dumps(params or {})
    e["PYTHONDONTWRITEBYTECODE"] = "1"
    if config is not None:
        doc = profiler_config(out, **config)
        doc.update(top or {})
        path = work / "profilerconfig.json"
        path.write_text(json.dumps(doc))
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
