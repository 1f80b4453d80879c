"""`trainprof trigger --memory` (docs/trigger.md; docs/formats.md, "Memory windows") without a
GPU: two ranks of scripts/torch_memory_fake.py (a fake torch whose CUDA memory calls it
records; no MemoryProfilingConfig) run a loop through trainprof.torch, the real command asks
for a memory window mid-run, the real library arms it on the same steps in both ranks, the
real package records history for those steps and writes one snapshot per rank. Every wait is
on an event (a presence file, a snapshot, a step reached, a line), bounded."""

import importlib.util
import json
import os
import pathlib
import pickle
import re
import subprocess
import sys
import time

import pytest

from trainer_runs import CLEARED_ENV, PACKAGE_DIR, package_messages, profiler_config

if importlib.util.find_spec("torch") is not None:
    pytest.skip("torch is installed: this tier fakes it", allow_module_level=True)

SCRIPT = pathlib.Path(__file__).resolve().parent / "scripts" / "torch_memory_fake.py"


def wait_for(cond, what, proc, bound_s=60.0):
    t0 = time.monotonic()
    while not cond():
        if proc.poll() is not None:
            pytest.fail("%s: the job ended first (%s)" % (what, proc.returncode))
        if time.monotonic() - t0 > bound_s:
            pytest.fail("timed out waiting for " + what)
        time.sleep(0.02)


class Job:
    """The fake-torch loop with ``ranks`` ranks, in the background, until :meth:`finish`."""

    def __init__(self, tmp_path, hook_lib, ranks, **params):
        self.out = tmp_path / "out"
        self.stop = tmp_path / "stop"
        self.manifest = tmp_path / "manifest.json"
        self.ranks = ranks
        cfg = tmp_path / "profilerconfig.json"
        cfg.write_text(json.dumps(profiler_config(self.out)))  # no MemoryProfilingConfig
        env = {k: v for k, v in os.environ.items() if k not in CLEARED_ENV}
        env.update(
            PYTHONPATH=str(PACKAGE_DIR),
            PYTHONDONTWRITEBYTECODE="1",
            TRAINPROF_HOOK_LIB=str(hook_lib),
            SMPROFILER_CONFIG_PATH=str(cfg),
            TRAINPROF_RESOURCE_CONFIG=str(tmp_path / "none.json"),
            TRAINPROF_TEST_MANIFEST=str(self.manifest),
            TRAINPROF_TEST_PARAMS=json.dumps({"stop": str(self.stop), "ranks": ranks, "steps": 6000, **params}),
        )
        self.stderr_path = tmp_path / "stderr.txt"
        with open(self.stderr_path, "w") as err:
            self.proc = subprocess.Popen([sys.executable, str(SCRIPT)], env=env, cwd=str(tmp_path),
                                         stdout=subprocess.PIPE, stderr=err, text=True)
        wait_for(lambda: len(self.presences()) == ranks, "every rank's presence file", self.proc)

    def presences(self):
        d = self.out / "trigger"
        return sorted(p.name for p in d.iterdir() if p.name.startswith("rank-")) if d.is_dir() else []

    def manifests(self):
        """{rank: manifest} of the ranks that wrote one."""
        found = {}
        for r in range(self.ranks):
            try:
                found[r] = json.loads(pathlib.Path("%s.%d" % (self.manifest, r)).read_text())
            except (OSError, ValueError):  # not yet, or being rewritten
                pass
        return found

    def snapshots(self):
        """{node: sorted file names} under framework/memory/."""
        root = self.out / "framework" / "memory"
        return {d.name: sorted(p.name for p in d.iterdir()) for d in root.iterdir()} if root.is_dir() else {}

    def finish(self):
        self.stop.touch()
        out, _ = self.proc.communicate(timeout=120)
        assert self.proc.returncode == 0, self.stderr_path.read_text()
        return out, self.stderr_path.read_text()

    def events(self, name):
        found = []
        for f in (self.out / "framework" / "pevents").rglob("*.json"):
            found += [(f.name.split("_")[1], e) for e in json.loads(f.read_text()) if e.get("name") == name]
        return found


def trigger(trainprof_bin, *args):
    return subprocess.run([str(trainprof_bin), "trigger", *map(str, args)], capture_output=True, text=True,
                          timeout=120)


def armed_range(t, ranks):
    """The one step range every rank reported in the command's output."""
    assert t.returncode == 0, (t.stdout, t.stderr)
    lines = dict(re.findall(r"^  (\S+): (.*)$", t.stdout, re.M))
    assert len(lines) == ranks and all(v.startswith("reached") for v in lines.values()), t.stdout
    ranges = {re.search(r"steps (\d+)\.\.=(\d+)", v).groups() for v in lines.values()}
    assert len(ranges) == 1, t.stdout
    return tuple(map(int, ranges.pop()))


def test_a_triggered_memory_window_dumps_one_snapshot_per_rank_for_its_steps(tmp_path, trainprof_bin, hook_lib):
    job = Job(tmp_path, hook_lib, ranks=2)
    try:
        t = trigger(trainprof_bin, "--memory", "--steps", 3, "--roundup", 5, "--wait", 20, job.out)
        start, last = armed_range(t, 2)
        assert start % 5 == 0 and last == start + 2
        assert "framework/memory/0-" in t.stdout and "framework/memory/1-" in t.stdout, t.stdout
        # The window ends at the begin of step start + 3, where each rank dumps its snapshot.
        wait_for(lambda: len(job.snapshots()) == 2 and all(job.snapshots().values()), "a snapshot of each rank",
                 job.proc)
        wait_for(lambda: all(m.get("calls", [])[-1:] == [["stop"]] for m in job.manifests().values())
                 and len(job.manifests()) == 2, "history off in each rank", job.proc)
    finally:
        _, err = job.finish()
    snaps = job.snapshots()
    assert sorted(n.split("-")[0] for n in snaps) == ["0", "1"], snaps
    for node, names in snaps.items():
        assert len(names) == 1 and re.fullmatch(r"window-%d-%d-\d{16}\.pickle" % (start, last), names[0]), snaps
        path = job.out / "framework" / "memory" / node / names[0]
        assert (path.stat().st_mode & 0o777) == 0o600
        snap = pickle.loads(path.read_bytes())
        # The fake's snapshot of the step it was taken at: the first step after the window.
        assert snap["device_traces"][0][0]["frames"][0]["line"] == 10 + start + 3
    for rank, m in job.manifests().items():
        # History on at the window's first step (the config's defaults: bounded, Python
        # stacks), one snapshot at the first step after it, then history off; nothing else.
        assert m["calls"] == [["record", 100000, "python"], ["snapshot", start + 3, True], ["stop"]], (rank, m)
        # No MemoryProfilingConfig: the package never asked the library about the memory
        # window (trainprof_step_next said it, in the call it makes at every step anyway).
        assert m["memory_questions"] == 0, (rank, m)
        assert m["settings_asked"] == 1, (rank, m)  # once, when the window first opened
    assert package_messages(err) == [], err
    events = job.events("trainprof:RequestedWindow")
    assert sorted(n.split("-")[0] for n, _ in events) == ["0", "1"], events
    assert {(e["args"]["window_start_step"], tuple(e["args"]["features"])) for _, e in events} == {(start, ("memory",))}


def test_without_cuda_one_line_says_the_window_cannot_run_and_nothing_else_changes(tmp_path, trainprof_bin,
                                                                                     hook_lib):
    job = Job(tmp_path, hook_lib, ranks=1, cuda=False)
    try:
        t = trigger(trainprof_bin, "--memory", "--steps", 3, "--wait", 20, job.out)
        start, last = armed_range(t, 1)
        # Past the window and the step after it (which would dump a snapshot).
        wait_for(lambda: job.manifests().get(0, {}).get("step", -1) > last + 2, "the steps after the window",
                 job.proc)
    finally:
        out, err = job.finish()
    assert out == "", out
    lines = package_messages(err)
    assert len(lines) == 1 and "a memory window was opened" in lines[0] and "cannot run" in lines[0], err
    assert "need CUDA" in lines[0]
    assert job.snapshots() == {} and not (job.out / "framework" / "memory").exists()
    m = job.manifests()[0]
    assert m["calls"] == [] and m["memory_questions"] == 0, m
    assert m["settings_asked"] == 1, m  # tried once, not again at each step of the window
