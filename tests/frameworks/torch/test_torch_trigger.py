"""`trainprof trigger` on a real PyTorch job across two "nodes" (the opt-in tier:
scripts/test-frameworks torch; docs/trigger.md): 4 gloo ranks in DistributedDataParallel
(scripts/ddp_ranks.py), two per `trainprof run` agent, each agent with its own LocalPath and
node name (its resource config), both uploading to one prefix of the real S3-compatible
server (tests/conftest.py's ``s3``) and relaying requests (`--s3-triggers`). One request
through the prefix opens a detailed window of 3 steps on the same step (a multiple of 10) on
every rank: torch.profiler's op events land on those steps in every rank's timeline and the
report lists the window for the 4 ranks; then `--stacks` dumps every rank while the job goes
on, and the job's exit status is its own."""

import json
import os
import pathlib
import re
import subprocess
import sys
import time

import pytest

pytest.importorskip("torch")

from s3_support import SECRET, agent_env  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parents[3]
SCRIPT = pathlib.Path(__file__).resolve().parent / "scripts" / "ddp_ranks.py"
PREFIX = "job"
HOSTS = ["algo-1", "algo-2"]


def wait_for(cond, what, bound_s=120.0, alive=()):
    t0 = time.monotonic()
    while not cond():
        for n in alive:
            if n.proc.poll() is not None:
                pytest.fail("%s: %s ended first (%s)\n%s" % (what, n.host, n.proc.returncode, n.stderr()))
        if time.monotonic() - t0 > bound_s:
            pytest.fail("timed out waiting for " + what)
        time.sleep(0.1)


class Node:
    def __init__(self, tmp_path, trainprof_bin, hook_lib, s3, index):
        self.host = HOSTS[index]
        work = tmp_path / self.host
        work.mkdir()
        self.out = work / "out"
        cfg = work / "profilerconfig.json"
        cfg.write_text(json.dumps({"ProfilingParameters": {"LocalPath": str(self.out)}}))
        rc = work / "resourceconfig.json"
        rc.write_text(json.dumps({"current_host": self.host, "hosts": HOSTS}))
        self.stop = tmp_path / "stop"
        env = agent_env(
            s3.endpoint,
            PYTHONPATH=str(ROOT / "hook-ffi" / "python"),
            PYTHONDONTWRITEBYTECODE="1",
            TRAINPROF_HOOK_LIB=str(hook_lib),
            TRAINPROF_RESOURCE_CONFIG=str(rc),
            TRAINPROF_NVML_LIB=str(work / "no-libnvidia-ml.so.1"),
            TRAINPROF_TEST_PARAMS=json.dumps({"store": str(tmp_path / "store"), "stop": str(self.stop),
                                              "node_index": index, "ranks_per_node": 2, "world": 4}),
            RANK=None, LOCAL_RANK=None, WORLD_SIZE=None, MASTER_ADDR=None, MASTER_PORT=None,
        )
        self.stderr_path = work / "stderr.txt"
        with open(self.stderr_path, "w") as err:
            self.proc = subprocess.Popen(
                [str(trainprof_bin), "run", "--config", str(cfg), "--no-report", "--keep-local",
                 "--s3", s3.url(PREFIX), "--s3-endpoint", s3.endpoint, "--s3-triggers", "--s3-trigger-poll", "1",
                 "--", sys.executable, str(SCRIPT)],
                env=env, cwd=str(work), stdout=subprocess.DEVNULL, stderr=err, start_new_session=True)

    def stderr(self):
        return self.stderr_path.read_text()

    def presences(self):
        d = self.out / "trigger"
        return [p for p in d.iterdir() if p.name.startswith("rank-")] if d.is_dir() else []


def trigger(trainprof_bin, s3, *args):
    t = subprocess.run([str(trainprof_bin), "trigger", *map(str, args), "--s3-endpoint", s3.endpoint, s3.url(PREFIX)],
                       capture_output=True, text=True, timeout=180, env=agent_env(s3.endpoint))
    assert SECRET not in t.stdout + t.stderr
    return t


def rank_lines(stdout):
    return {m.group(1): m.group(2) for m in re.finditer(r"^  (\S+): (.*)$", stdout, re.M)}


def phase_names(path):
    """pid -> the phase (process_name) of one timeline file."""
    return {e["pid"]: e["args"].get("name") for e in json.loads(path.read_text())
            if e.get("ph") == "M" and e.get("name") == "process_name"}


def test_four_ddp_ranks_on_two_nodes_open_one_window_on_the_same_step(tmp_path, trainprof_bin, hook_lib, s3):
    nodes = [Node(tmp_path, trainprof_bin, hook_lib, s3, i) for i in (0, 1)]
    try:
        for n in nodes:
            wait_for(lambda: len(n.presences()) == 2, n.host + "'s two ranks", alive=nodes)
            wait_for(lambda: s3.keys("%s/system/node/%s/" % (PREFIX, n.host)), n.host + "'s node record",
                     alive=nodes)
        t = trigger(trainprof_bin, s3, "--detailed", "--steps", 3, "--roundup", 10, "--wait", 40)
        assert t.returncode == 0, (t.stdout, t.stderr)
        lines = rank_lines(t.stdout)
        assert len(lines) == 4 and all(v.startswith("reached") for v in lines.values()), t.stdout
        ranges = {re.search(r"steps (\d+)\.\.=(\d+)", v).groups() for v in lines.values()}
        assert len(ranges) == 1, t.stdout
        start, last = map(int, ranges.pop())
        assert start % 10 == 0 and last == start + 2
        # Each rank's line at its window's first step.
        for n in nodes:
            wait_for(lambda: len(re.findall(r"trainprof trigger \w+: detailed for steps ", n.stderr())) == 2,
                     n.host + "'s windows", alive=nodes)
        # Stacks of every rank now; the job goes on.
        s = trigger(trainprof_bin, s3, "--stacks", "--wait", 40)
        assert s.returncode == 0, (s.stdout, s.stderr)
        stacks = rank_lines(s.stdout)
        assert len(stacks) == 4 and all(v.startswith("stacks dumped in ") for v in stacks.values()), s.stdout
        assert all(n.proc.poll() is None for n in nodes), "the job goes on"
    finally:
        for n in nodes:
            n.stop.touch()
        codes = []
        for n in nodes:
            try:
                codes.append(n.proc.wait(timeout=180))
            except subprocess.TimeoutExpired:
                os.killpg(n.proc.pid, 9)
                codes.append(n.proc.wait())
    assert codes == [0, 0], [n.stderr()[-3000:] for n in nodes]
    # torch.profiler's op events of every rank are on the window's steps, and only there.
    for n in nodes:
        ops = {}
        for f in (n.out / "framework" / "pevents").rglob("*.json"):
            names = phase_names(f)
            rank = f.name.split("_")[1].split("-")[0]
            for e in json.loads(f.read_text()):
                if e.get("ph") == "X" and names.get(e.get("pid")) == "cpu_functions":
                    ops.setdefault(rank, set()).add(int(e["args"]["step_num"]))
        assert len(ops) == 2, (n.host, sorted(ops))
        for rank, steps in ops.items():
            assert steps == {start, start + 1, start + 2}, (n.host, rank, sorted(steps))
        # Each rank dumped its stacks: a `requested` dump with the DDP script in its Python stacks.
        dumps = sorted((n.out / "framework" / "hangs").glob("*/*/stall.json"))
        assert len(dumps) == 2, dumps
        for d in dumps:
            assert json.loads(d.read_text())["kind"] == "requested"
            assert "ddp_ranks.py" in (d.parent / "python_stacks.txt").read_text()
    # The report over the prefix lists the window for the 4 ranks, on the same steps.
    r = subprocess.run([str(trainprof_bin), "report", s3.url(PREFIX), "--s3-endpoint", s3.endpoint, "--json"],
                       capture_output=True, text=True, timeout=300, env=agent_env(s3.endpoint))
    assert r.returncode == 0, r.stderr
    requested = json.loads(r.stdout)["requested"]
    assert len(requested) == 4, requested
    assert {w["rank"].split("-", 1)[1] for w in requested} == set(HOSTS)
    assert {(w["window_start_step"], w["window_num_steps"]) for w in requested} == {(start, 3)}
