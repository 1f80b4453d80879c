"""`trainprof report` over many ranks (docs/report.md, "Many ranks"): synthetic jobs of
`bench/synth_job.py --nodes N` (N nodes × 8 ranks, system rows every 100 ms).

* A planted straggler (one rank's steps 15 % slower) on a node with planted thermal throttling
  (its GPUs' ThrottleReasonsMask 0x60 with the ThrottleSwThermal / ThrottleHwThermal rows) is
  named, with that cause and its evidence, in `--json` and on the page.
* From the local S3 server (moto), the report of 8 nodes stays within the memory bound, and
  its peak RSS does not grow materially from 2 to 8 nodes (memory only: nothing is timed)."""

import concurrent.futures
import json
import os
import pathlib
import re
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests" / "s3"))

from s3_support import agent_env  # noqa: E402

SYNTH = ROOT / "bench" / "synth_job.py"
# docs/report.md, "Many ranks": what a report of 64 nodes × 8 ranks holds beside its step
# table stays under this (measured well below it; a generous margin).
BOUND_MB = 400


def synth(out, nodes, minutes=2, **extra):
    args = [sys.executable, str(SYNTH), str(out), "--nodes", str(nodes), "--minutes", str(minutes)]
    for k, v in extra.items():
        args += ["--" + k.replace("_", "-"), str(v)]
    subprocess.run(args, check=True, stdout=subprocess.DEVNULL, timeout=300)
    return out


def peak_rss_mb(argv, env=None, cwd=None, stdout=None):
    """(exit status, peak RSS MiB, stderr) of one child, from its own rusage (os.wait4)."""
    with open(os.devnull, "w") if stdout is None else open(stdout, "w") as sink:
        proc = subprocess.Popen(argv, stdout=sink, stderr=subprocess.PIPE, env=env, cwd=cwd)
        err = proc.stderr.read().decode(errors="replace")
        _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    return proc.returncode, usage.ru_maxrss / 1024.0, err


def test_a_straggler_on_a_hot_node_is_named_with_thermal_throttling(trainprof_bin, tmp_path):
    job = synth(tmp_path / "job", nodes=4, straggler=13, straggler_slow=1.15, thermal_node=2)
    proc = subprocess.run([str(trainprof_bin), "report", str(job), "--json"], capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr
    fleet = json.loads(proc.stdout)["fleet"]
    assert (fleet["mode"], fleet["ranks"], fleet["nodes"]) == ("TRAIN", 32, 4)
    assert [s["rank"] for s in fleet["stragglers"]] == ["13-algo-2"], fleet["scores"][:3]
    s = fleet["stragglers"][0]
    assert s["node"] == "algo-2"
    assert 1.1 < s["slowdown"] < 1.2 and s["score"] >= fleet["z_threshold"]
    assert [c["cause"] for c in s["causes"]] == ["thermal_throttling"]
    cause = s["causes"][0]
    assert "ThrottleSwThermal, ThrottleHwThermal" in cause["evidence"]
    assert cause["node_value"] > 0.3 and cause["fleet_value"] == 0
    # While the rank ran.
    assert s["from_s"] <= cause["to_s"] and cause["from_s"] <= s["to_s"]
    # The scores: every rank, the straggler first; nobody else above the threshold.
    assert len(fleet["scores"]) == 32 and fleet["scores"][0]["rank"] == "13-algo-2"
    assert all(not x["straggler"] for x in fleet["scores"][1:])
    assert fleet["scores"][0]["relative"] < 0.9
    # The page: the straggler, its cause and evidence; the step chart as a distribution.
    page = tmp_path / "report.html"
    proc = subprocess.run([str(trainprof_bin), "report", str(job), "-o", str(page)], capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    html = page.read_text()
    assert "<b>Straggler: 13-algo-2</b> on algo-2" in html
    assert 'data-cause="thermal_throttling"' in html
    assert "ThrottleSwThermal, ThrottleHwThermal" in html
    data = json.loads(re.search(r'<script type="application/json" id="report-data">(.*?)</script>', html,
                                re.S).group(1))
    drawn = [r["rank"] for r in data["modes"][0]["ranks"]]
    assert {"p10 of 32 ranks", "p50 of 32 ranks", "p90 of 32 ranks", "max of 32 ranks"} <= set(drawn)
    assert "13-algo-2 (slow)" in drawn and len(drawn) <= 4 + 8


def test_many_nodes_from_s3_stay_within_the_memory_bound(trainprof_bin, s3, tmp_path):
    """2 and 8 nodes × 8 ranks × 2 minutes, uploaded to moto, reported from `s3://`. Peak RSS
    (the child's own rusage): under BOUND_MB, and 8 nodes at most 3× 2 nodes' (the step
    table and per-node state grow; nothing grows per rank beyond them). 16 nodes made this
    the suite's longest test by far (5 minutes under load, most of it moto moving 180 MB
    four times) for no more than 8 show."""
    rss = {}
    for nodes in (2, 8):
        job = synth(tmp_path / f"job{nodes}", nodes=nodes, cores=4, ops=40, straggler=13, straggler_slow=1.15,
                    thermal_node=2)
        prefix = f"fleet{nodes}"
        files = [p for p in job.rglob("*") if p.is_file()]
        with concurrent.futures.ThreadPoolExecutor(8) as pool:
            list(pool.map(lambda p: s3.client.upload_file(str(p), s3.bucket, f"{prefix}/{p.relative_to(job)}"),
                          files))
        argv = [str(trainprof_bin), "report", s3.url(prefix), "--json", "--s3-endpoint", s3.endpoint]
        out = tmp_path / f"report{nodes}.json"
        status, mb, err = peak_rss_mb(argv, env=agent_env(s3.endpoint), cwd=tmp_path, stdout=out)
        assert status == 0, err
        fleet = json.loads(out.read_text())["fleet"]
        assert fleet["ranks"] == 8 * nodes and [s["rank"] for s in fleet["stragglers"]] == ["13-algo-2"]
        rss[nodes] = mb
    print("peak RSS MiB by nodes:", rss)
    assert rss[8] < BOUND_MB, rss
    assert rss[8] < 3 * rss[2], rss
    # `trace` and `compare` read the same prefixes through the same download.
    env = agent_env(s3.endpoint)
    trace = tmp_path / "trace.json.gz"
    status, mb, err = peak_rss_mb([str(trainprof_bin), "trace", s3.url("fleet8"), "-o", str(trace),
                                   "--s3-endpoint", s3.endpoint], env=env, cwd=tmp_path)
    assert status == 0 and trace.stat().st_size > 0, err
    assert mb < BOUND_MB, mb
    out = tmp_path / "compare.json"
    status, mb, err = peak_rss_mb([str(trainprof_bin), "compare", s3.url("fleet2"), s3.url("fleet8"), "--json",
                                   "--s3-endpoint", s3.endpoint], env=env, cwd=tmp_path, stdout=out)
    assert status in (0, 1), err  # 1: the gate (B slower), not an error
    assert json.loads(out.read_text()), err
    assert mb < 2 * BOUND_MB, mb
