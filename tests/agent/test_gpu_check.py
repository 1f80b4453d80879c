"""scripts/gpu-check where there is no GPU: against the fake libnvidia-ml.so.1
(agent/tests/c/fake_nvml.c) its agent part runs and measures both agents, and the parts that
need nvidia-ml-py, torch or a CUDA device say so instead of failing; the summary goes to stdout
and to $OUT/gpu-check.md."""

import os
import pathlib
import re
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]


def test_gpu_check_runs_without_a_gpu(trainprof_bin, fake_nvml, tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TRAINPROF_", "SMPROFILER_", "FAKE_NVML_"))}
    env.update(
        TRAINPROF_BIN=str(trainprof_bin),
        TRAINPROF_NVML_LIB=str(fake_nvml),
        GPU_CHECK_PYTHON=sys.executable,
        GPU_CHECK_AGENT_SECONDS="2",
        OUT=str(tmp_path),
    )
    proc = subprocess.run([str(ROOT / "scripts" / "gpu-check")], env=env, capture_output=True, text=True, timeout=150)
    assert proc.returncode == 0, proc.stderr
    md = proc.stdout
    assert (tmp_path / "gpu-check.md").read_text() == md
    # The agent part: a number per agent; the fake GPUs' rows from the one with NVML only.
    rows = {m.group(1): m for m in re.finditer(r"^\| (with GPU|without GPU) \| ([0-9]+) \| [0-9.]+ \| [0-9.]+ \| ([0-9]+) \|$", md, re.M)}
    assert set(rows) == {"with GPU", "without GPU"}, md
    assert int(rows["with GPU"].group(3)) > 0 and int(rows["without GPU"].group(3)) == 0, md
    assert int(rows["with GPU"].group(2)) > 0, md
    # Beside it, each agent's own account of its cost (system/cost/): the NVML kinds per GPU
    # for the one with the fake GPUs, none for the other; the per-GPU cost both ways.
    assert "**with GPU, by its own account**" in md and "**without GPU, by its own account**" in md, md
    own = md.split("**with GPU, by its own account**")[1].split("**without GPU")[0]
    assert re.search(r"^\| nvml\.utilization \| [0-9.]+ \| [0-9.]+ \| [0-9.]+ \| [0-9.]+ \|$", own, re.M), own
    assert "nvml." not in md.split("**without GPU, by its own account**")[1].split("Per GPU and tick")[0], md
    assert re.search(r"Per GPU and tick: -?[0-9]+ µs from outside .* [0-9]+ µs by the agent's own account", md), md
    # What it cannot do here, it says.
    try:
        import pynvml  # noqa: F401
    except ImportError:
        assert "skipped: nvidia-ml-py (pynvml) is not installed" in md
    assert re.search(r"skipped: (no torch|torch .* sees no CUDA device)", md), md
    assert "failed**" not in md, md
