"""Hang detection across ranks on a real collective (the opt-in tier: scripts/test-frameworks
torch): two trainers under `trainprof run`, joined by a `gloo` process group. Rank 1 steps to 29
and never joins step 30's all_reduce; rank 0 waits in it (its watchdog dumps the stall,
HangTimeoutS 1) until gloo's timeout raises. The report names rank 1 as the stall's likely
culprit and step 30; rank 0's uncaught exception is a crash of its own; the exit status is the
launcher's, as without trainprof (docs/report.md, "Hangs and crashes")."""

import json
import os
import pathlib
import subprocess
import sys

import pytest

pytest.importorskip("torch")

ROOT = pathlib.Path(__file__).resolve().parents[3]

RANK_SCRIPT = r'''
import datetime, os, sys, time
import torch
import torch.distributed as dist
import trainprof
rank = int(os.environ["RANK"])
dist.init_process_group("gloo", init_method="file://" + sys.argv[1], rank=rank, world_size=2,
                        timeout=datetime.timedelta(seconds=8))
prof = trainprof.Profiler(framework="pytorch")
t = torch.ones(4)
for step in range(40 if rank == 0 else 30):
    prof.step_begin("train")
    time.sleep(0.005)
    dist.all_reduce(t)
    prof.step_end()
if rank == 1:
    # Never joins step 30's all_reduce: sleeps outside a step past rank 0's timeout.
    time.sleep(12)
prof.close()
'''

LAUNCHER = r'''
import os, subprocess, sys
store = sys.argv[2]
procs = [subprocess.Popen([sys.executable, "-c", sys.argv[1], store], env=dict(os.environ, RANK=str(r)))
         for r in (0, 1)]
codes = [p.wait() for p in procs]
print("ranks exited", codes, flush=True)
sys.exit(7 if codes[1] == 0 and codes[0] != 0 else 9)
'''


def test_a_gloo_all_reduce_rank_1_never_joins_names_rank_1(trainprof_bin, hook_lib, tmp_path):
    root = tmp_path / "profiler"
    cfg = tmp_path / "profilerconfig.json"
    cfg.write_text(json.dumps({"ProfilingParameters": {
        "LocalPath": str(root), "HangDetectionConfig": json.dumps({"HangTimeoutS": 1})}}))
    drop = ("TRAINPROF_", "SMPROFILER_", "RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "MV2_COMM_WORLD_RANK",
            "SLURM_PROCID", "PYTHONPATH", "MASTER_", "WORLD_SIZE", "LOCAL_RANK")
    env = {k: v for k, v in os.environ.items() if not k.startswith(drop)}
    env.update(SMPROFILER_CONFIG_PATH=str(cfg), TRAINPROF_HOOK_LIB=str(hook_lib),
               PYTHONPATH=str(ROOT / "hook-ffi" / "python"),
               TRAINPROF_NVML_LIB=str(tmp_path / "no-libnvidia-ml.so.1"),
               TRAINPROF_RESOURCE_CONFIG=str(tmp_path / "no-resourceconfig.json"))
    proc = subprocess.run(
        [str(trainprof_bin), "run", "--", sys.executable, "-c", LAUNCHER, RANK_SCRIPT, str(tmp_path / "store")],
        env=env, capture_output=True, text=True, timeout=300)
    # Rank 0's all_reduce timed out (an uncaught exception), rank 1 exited 0: the launcher's 7.
    assert proc.returncode == 7, proc.stdout + proc.stderr
    stalls = sorted((root / "framework" / "hangs").glob("0-*/30-*/stall.json"))
    assert stalls, proc.stderr
    r0 = stalls[0].parent.parent.name
    r1 = "1-" + r0[2:]
    out = subprocess.run([str(trainprof_bin), "report", str(root), "--json", "-o", str(tmp_path / "r.html")],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    incidents = json.loads(out.stdout)["hangs"]["incidents"]
    stall = next(i for i in incidents if i["kind"] == "stall")
    assert stall["step"] == 30
    assert stall["culprits"] == [r1], stall["evidence"]
    assert stall["reason"] == "lowest_step"
    ranks = {r["rank"]: r for r in stall["ranks"]}
    assert ranks[r1]["last_completed_step"] == 29 and ranks[r0]["last_begun_step"] == 30
    # Rank 0 waits inside the all_reduce (its Python stack names it).
    frames = [f for t in stall["dumps"][0]["python"] for f in t["frames"]]
    assert any("all_reduce" in f for f in frames), frames
    # The timeout's exception is rank 0's crash.
    assert any(i["kind"] == "exception" and i["culprits"] == [r0] for i in incidents), incidents
    assert f"Likely culprit: <b>{r1}</b>" in (tmp_path / "r.html").read_text()
