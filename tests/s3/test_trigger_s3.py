"""`trainprof trigger s3://…` (docs/trigger.md, "Every node of a job through S3";
docs/formats.md, "Every node through S3"): two "nodes" (two `trainprof run` agents with
their own LocalPath and node name, sharing one S3 prefix on the real S3-compatible server of
tests/s3), each running two plain-Python ranks with the hook (tests/hook/scripts/
trigger_ranks.py). The request goes into the prefix; each agent started with --s3-triggers
relays it to its ranks and their answers back. Every wait is on an event, bounded."""

import json
import os
import pathlib
import re
import subprocess
import sys
import time

import pytest

from s3_support import SECRET, agent_env
from trainer_runs import PACKAGE_DIR, profiler_config

ROOT = pathlib.Path(__file__).resolve().parents[2]
SCRIPTS = ROOT / "tests" / "hook" / "scripts"
PREFIX = "job"
HOSTS = ["algo-1", "algo-2"]
FEATURES = "detailed|dataloader|python|native"


def wait_for(cond, what, bound_s=30.0, alive=()):
    t0 = time.monotonic()
    while True:
        value = cond()
        if value:
            return value
        for node in alive:
            if node.proc.poll() is not None:
                pytest.fail("%s: %s ended first (%s)\n%s" % (what, node.host, node.proc.returncode, node.stderr()))
        if time.monotonic() - t0 > bound_s:
            pytest.fail("timed out waiting for " + what)
        time.sleep(0.05)


class Node:
    """`trainprof run` (with or without --s3-triggers) around two ranks of trigger_ranks.py,
    as node ``host`` (its resource config), uploading to the shared prefix."""

    def __init__(self, tmp_path, trainprof_bin, hook_lib, s3, host, relay=True):
        self.host = host
        work = tmp_path / host
        work.mkdir()
        self.out = work / "out"
        self.stop = work / "stop"
        cfg = work / "profilerconfig.json"
        cfg.write_text(json.dumps(profiler_config(self.out)))
        rc = work / "resourceconfig.json"
        rc.write_text(json.dumps({"current_host": host, "hosts": HOSTS}))
        env = agent_env(
            s3.endpoint,
            PYTHONPATH=os.pathsep.join([str(PACKAGE_DIR), str(SCRIPTS)]),
            PYTHONDONTWRITEBYTECODE="1",
            TRAINPROF_HOOK_LIB=str(hook_lib),
            TRAINPROF_RESOURCE_CONFIG=str(rc),
            TRAINPROF_NVML_LIB=str(work / "no-libnvidia-ml.so.1"),
            TRAINPROF_TEST_PARAMS=json.dumps({"stop": str(self.stop), "release": str(work / "release")}),
            RANK=None,
        )
        relay_flags = ["--s3-triggers", "--s3-trigger-poll", "1"] if relay else []
        self.stderr_path = work / "stderr.txt"
        with open(self.stderr_path, "w") as err:
            self.proc = subprocess.Popen(
                [str(trainprof_bin), "run", "--config", str(cfg), "--no-report", "--keep-local",
                 "--s3", s3.url(PREFIX), "--s3-endpoint", s3.endpoint, *relay_flags, "--",
                 sys.executable, str(SCRIPTS / "trigger_ranks.py")],
                env=env, cwd=str(work), stdout=subprocess.DEVNULL, stderr=err, start_new_session=True)

    def ready(self, s3):
        """Both ranks announced, and the agent's node record is in S3 (the trigger expects
        the nodes that wrote one)."""
        wait_for(lambda: len(self.files("rank-")) == 2, self.host + "'s ranks", alive=[self])
        wait_for(lambda: s3.keys("%s/system/node/%s/" % (PREFIX, self.host)), self.host + "'s node record",
                 alive=[self])

    def files(self, prefix):
        d = self.out / "trigger"
        return sorted(p.name for p in d.iterdir() if p.name.startswith(prefix)) if d.is_dir() else []

    def stderr(self):
        return self.stderr_path.read_text()

    def finish(self):
        self.stop.touch()
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, 9)
            self.proc.wait()
        assert SECRET not in self.stderr()
        return self.proc.returncode

    def window_opened(self, count):
        """Each rank's line at its requested window's first step (docs/formats.md, "At the
        window's first step")."""
        wait_for(lambda: len(re.findall(r"^trainprof-hook\[\d+\]: trainprof trigger \w+: (?:%s)(?:, (?:%s))* for steps " % (FEATURES, FEATURES),
                                        self.stderr(), re.M)) >= count,
                 self.host + "'s windows opening", alive=[self])

    def events(self, name):
        found = []
        for f in (self.out / "framework" / "pevents").rglob("*.json"):
            found.extend(e for e in json.loads(f.read_text()) if e.get("name") == name)
        return found


@pytest.fixture
def nodes(tmp_path, trainprof_bin, hook_lib, s3):
    started = []

    def start(host, relay=True):
        n = Node(tmp_path, trainprof_bin, hook_lib, s3, host, relay)
        started.append(n)
        return n

    yield start
    for n in started:
        if n.proc.poll() is None:
            os.killpg(n.proc.pid, 9)
            n.proc.wait()


def trigger(trainprof_bin, s3, *args):
    env = agent_env(s3.endpoint)
    t = subprocess.run([str(trainprof_bin), "trigger", *map(str, args), "--s3-endpoint", s3.endpoint, s3.url(PREFIX)],
                       capture_output=True, text=True, timeout=120, env=env)
    assert SECRET not in t.stdout + t.stderr
    return t


def rank_lines(stdout):
    return {m.group(1): m.group(2) for m in re.finditer(r"^  (\S+): (.*)$", stdout, re.M)}


def test_every_rank_of_both_nodes_arms_on_the_same_step_and_garbage_is_refused(
        tmp_path, trainprof_bin, s3, nodes):
    a, b = nodes("algo-1"), nodes("algo-2")
    a.ready(s3)
    b.ready(s3)
    t0 = time.monotonic()
    t = trigger(trainprof_bin, s3, "--detailed", "--steps", 3, "--roundup", 10, "--wait", 20)
    took = time.monotonic() - t0
    assert t.returncode == 0, (t.stdout, t.stderr)
    lines = rank_lines(t.stdout)
    assert len(lines) == 4 and all(v.startswith("reached") for v in lines.values()), t.stdout
    assert sorted(k.split("-")[1] + "-" + k.split("-")[2] for k in lines) == ["algo-1"] * 2 + ["algo-2"] * 2
    ranges = {re.search(r"steps (\d+)\.\.=(\d+)", v).groups() for v in lines.values()}
    assert len(ranges) == 1, t.stdout
    start, last = map(int, ranges.pop())
    assert start % 10 == 0 and last == start + 2
    assert s3.url(PREFIX) + "/framework/pevents/" in t.stdout
    assert "4 of 4 ranks armed" in t.stdout
    print("trigger round: %.2f s" % took)
    # The trigger removed what it wrote and read; each relay the files it wrote locally.
    assert s3.keys(PREFIX + "/trigger/") == []
    for n in (a, b):
        wait_for(lambda: not n.files("request-") and not n.files("go-"), n.host + "'s relay cleaning up")
        assert "relayed to 2 ranks of " + n.host in n.stderr()

    # A garbage request put straight into the prefix: refused, nothing changes.
    s3.client.put_object(Bucket=s3.bucket, Key=PREFIX + "/trigger/request-bad1.json", Body=b'{"version": 1, "id": ')
    s3.client.put_object(Bucket=s3.bucket, Key=PREFIX + "/trigger/request-big1.json", Body=b" " * 5000)
    for n in (a, b):
        for rid, why in (("bad1", "the JSON ends early"), ("big1", "larger than 4096 bytes")):
            key = "%s/trigger/%s/%s/node.json" % (PREFIX, rid, n.host)
            wait_for(lambda: s3.keys(key), "%s's answer to %s" % (n.host, rid), alive=[n])
            answer = json.loads(s3.get(key))
            assert (answer["answer"], answer["node"], answer["id"]) == ("refused", n.host, rid)
            assert why in answer["reason"], answer
        assert not n.files("request-") and not n.files("ack-bad1") and not n.files("ack-big1")

    for n in (a, b):
        n.window_opened(2)
        assert n.finish() == 0, n.stderr()
        events = n.events("trainprof:RequestedWindow")
        assert len(events) == 2, events  # one per rank; the garbage armed nothing
        assert {(e["args"]["window_start_step"], e["args"]["step_num"]) for e in events} == {(start, str(start))}
        # The upload went on: the end markers are in S3 for this node's run.
        assert s3.keys("%s/system/incremental/" % PREFIX)
    assert PREFIX + "/system/training_job_end.ts" in s3.keys(PREFIX + "/system/")


def test_a_node_without_the_opt_in_is_reported_and_the_other_arms(tmp_path, trainprof_bin, s3, nodes):
    a, b = nodes("algo-1"), nodes("algo-2", relay=False)
    a.ready(s3)
    b.ready(s3)
    t = trigger(trainprof_bin, s3, "--python", "--steps", 2, "--wait", 6)
    assert t.returncode == 0, (t.stdout, t.stderr)
    assert "  node algo-2: no answer (is its agent running with --s3-triggers?)" in t.stdout.splitlines()
    lines = {k: v for k, v in rank_lines(t.stdout).items() if not k.startswith("node")}
    assert len(lines) == 2 and all("-algo-1-" in k and v.startswith("reached") for k, v in lines.items()), t.stdout
    assert "2 of 2 ranks armed" in t.stdout
    assert not b.files("request-"), "the node without the opt-in was never written to"
    a.window_opened(2)
    for n in (a, b):
        assert n.finish() == 0, n.stderr()
    assert len(a.events("trainprof:RequestedWindow")) == 2
    assert b.events("trainprof:RequestedWindow") == []


def test_no_agent_at_all(trainprof_bin, s3):
    t = trigger(trainprof_bin, s3, "--detailed", "--wait", 1)
    assert t.returncode == 1, (t.stdout, t.stderr)
    assert "no agent answered" in t.stderr, t.stderr
    assert s3.keys(PREFIX + "/") == [], "the request was removed"
