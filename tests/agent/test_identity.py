"""The job's identity (docs/formats.md, "Job identity") under SageMaker, torchrun and
Kubernetes, each set by the test as the platform sets it, end to end: `trainprof run` writes
it once into the node record, `report --json` and the page show it, and a hostile value stays
text everywhere. SLURM's run is in test_gpu.py (with the GPUs' part)."""

import json
import os
import subprocess

import pytest

HOSTILE = 'evil"</script><b>\n\x1b[31m\u202e' + "y" * 5_000
PLATFORM_VARS = ("SLURM", "KUBERNETES_", "TRAINING_JOB", "PET_", "SM_", "POD_", "NODE_NAME", "RANK", "LOCAL_RANK",
                 "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "NODE_RANK", "MASTER_", "TORCHELASTIC_",
                 "CUDA_VISIBLE_DEVICES", "NVIDIA_VISIBLE_DEVICES")
# What the agent keeps of it: 256 bytes, cut at a character boundary.
KEPT = HOSTILE.encode()[:256].decode(errors="ignore")

CASES = {
    # SageMaker: the resource config names the host; the platform's variables name the job.
    "sagemaker": dict(
        resource={"current_host": "algo-2", "hosts": ["algo-1", "algo-2", "algo-3"]},
        env={"TRAINING_JOB_NAME": HOSTILE, "SM_CURRENT_HOST": "algo-2"},
        node="algo-2",
        variables={"TRAINING_JOB_NAME": KEPT, "SM_CURRENT_HOST": "algo-2"},
        summary={"platform": "sagemaker", "host": "algo-2", "nodes": "3"},
    ),
    # torchrun, as a launcher sees it (the agent wraps it: the workers' RANK are not its own).
    "torchrun": dict(
        resource=None,
        env={"TORCHELASTIC_RUN_ID": HOSTILE, "PET_NNODES": "2", "PET_NODE_RANK": "1", "PET_NPROC_PER_NODE": "4",
             "WORLD_SIZE": "8", "RANK": "4", "LOCAL_RANK": "0"},
        node="algo-1",
        variables={"TORCHELASTIC_RUN_ID": KEPT, "PET_NNODES": "2", "WORLD_SIZE": "8", "RANK": "4"},
        summary={"platform": "torchrun", "rank": "4", "local_rank": "0", "world_size": "8"},
    ),
    # Kubernetes: the service host is always there; the pod's names from the downward API.
    "kubernetes": dict(
        resource=None,
        env={"KUBERNETES_SERVICE_HOST": "10.0.0.1", "POD_NAME": "trainer-0", "POD_NAMESPACE": HOSTILE,
             "NODE_NAME": "gpu-node-7"},
        node="algo-1",
        variables={"KUBERNETES_SERVICE_HOST": "10.0.0.1", "POD_NAME": "trainer-0", "POD_NAMESPACE": KEPT,
                   "NODE_NAME": "gpu-node-7"},
        summary={"platform": "kubernetes", "host": "gpu-node-7"},
    ),
}


@pytest.mark.parametrize("platform", sorted(CASES))
def test_the_identity_under_each_platform_and_hostile_values_stay_text(platform, trainprof_bin, tmp_path):
    case = CASES[platform]
    root = tmp_path / "profiler"
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("TRAINPROF_", "SMPROFILER_", "FAKE_NVML_") + PLATFORM_VARS)}
    env["TRAINPROF_NVML_LIB"] = str(tmp_path / "no-libnvidia-ml.so.1")
    env["SMPROFILER_CONFIG_PATH"] = str(tmp_path / "no-profilerconfig.json")
    rc = tmp_path / "resourceconfig.json"
    if case["resource"] is not None:
        rc.write_text(json.dumps(case["resource"]))
    env["TRAINPROF_RESOURCE_CONFIG"] = str(rc)
    env.update(case["env"])
    proc = subprocess.run([str(trainprof_bin), "run", "--interval-ms", "100", "--local-path", str(root), "--",
                           "sleep", "0.3"], env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr

    [record] = (root / "system" / "node" / case["node"]).iterdir()
    job = json.loads(record.read_text())["Job"]
    assert job["Platforms"] == [platform], job
    for name, value in case["variables"].items():
        assert job["Variables"][name] == value, (name, job)
    if case["resource"] is not None:
        assert (job["CurrentHost"], job["HostCount"]) == ("algo-2", 3), job

    report = subprocess.run([str(trainprof_bin), "report", str(root), "--json"], capture_output=True, text=True,
                            timeout=120)
    assert report.returncode == 0, report.stderr
    ident = json.loads(report.stdout)["job"]["identities"][case["node"]]
    for key, value in case["summary"].items():
        assert ident[key] == value, (key, ident)
    # The hostile value, shown: control characters escaped, cut to 128 bytes, one line.
    shown = next(v for v in ident.values() if isinstance(v, str) and v.startswith("evil"))
    assert "\n" not in shown and "\x1b" not in shown and "\u202e" not in shown, shown
    assert shown.startswith('evil"</script><b>\\x0a\\x1b[31m'), shown
    assert len(shown.encode()) <= 128 + len("…".encode()), shown
    page = (root / "report.html").read_text()
    assert "</script><b>" not in page and "\u202e" not in page
    assert "evil&quot;&lt;/script&gt;&lt;b&gt;" in page
