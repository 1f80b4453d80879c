"""`trainprof trigger` (docs/trigger.md; docs/formats.md, "On-demand windows (`trainprof
trigger`)"): real trainers (tests/hook/scripts/trigger_ranks.py, two ranks sharing a
LocalPath) under `trainprof run`, the request made mid-run, the answers and the files read
back. Every wait is on an event (a presence file, an answer, a stats folder), bounded."""

import json
import os
import pathlib
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time

import pytest

from trainer_runs import CLEARED_ENV, PACKAGE_DIR, profiler_config

SCRIPTS = pathlib.Path(__file__).resolve().parent / "scripts"


def wait_for(cond, what, bound_s=60.0, alive=None):
    t0 = time.monotonic()
    while not cond():
        if alive is not None and alive.poll() is not None:
            out, _ = alive.communicate()
            pytest.fail("%s: the job ended first (%s)\n%s" % (what, alive.returncode, out))
        if time.monotonic() - t0 > bound_s:
            pytest.fail("timed out waiting for " + what)
        time.sleep(0.02)


class Job:
    """`trainprof run` around trigger_ranks.py with ``ranks`` ranks, in the background."""

    def __init__(self, tmp_path, trainprof_bin, hook_lib, config=None, **params):
        self.out = tmp_path / "out"
        self.stop = tmp_path / "stop"
        self.release = tmp_path / "release"
        cfg = tmp_path / "profilerconfig.json"
        cfg.write_text(json.dumps(profiler_config(self.out, **(config or {}))))
        env = {k: v for k, v in os.environ.items() if k not in CLEARED_ENV}
        env.update(
            PYTHONPATH=os.pathsep.join([str(PACKAGE_DIR), str(SCRIPTS)]),
            TRAINPROF_HOOK_LIB=str(hook_lib),
            TRAINPROF_RESOURCE_CONFIG=str(tmp_path / "none.json"),
            TRAINPROF_NVML_LIB=str(tmp_path / "no-libnvidia-ml.so.1"),
            TRAINPROF_TEST_PARAMS=json.dumps({"stop": str(self.stop), "release": str(self.release), **params}),
        )
        self.ranks = params.get("ranks", 2)
        # stderr into a file, so that a test can wait for a line of it.
        self.stderr_path = tmp_path / "stderr.txt"
        with open(self.stderr_path, "w") as err:
            self.proc = subprocess.Popen(
                [str(trainprof_bin), "run", "--config", str(cfg), "--no-report", "--",
                 sys.executable, str(SCRIPTS / "trigger_ranks.py")],
                env=env, cwd=str(tmp_path), stdout=subprocess.PIPE, stderr=err, text=True)
        wait_for(lambda: len(self.presences()) == self.ranks, "every rank's presence file", alive=self.proc)

    def presences(self):
        d = self.out / "trigger"
        return sorted(p.name for p in d.iterdir() if p.name.startswith("rank-")) if d.is_dir() else []

    def finish(self):
        self.release.touch()
        self.stop.touch()
        self.proc.communicate(timeout=120)
        err = self.stderr()
        assert self.proc.returncode == 0, err
        return err

    def stderr(self):
        return self.stderr_path.read_text()

    def windows(self):
        """(rank, first step) of every Python-stats window written so far."""
        stats = self.out / "framework" / "pytorch" / "cprofile"
        return {(n.name.split("-")[0], int(d.name.split("-")[1]))
                for n in stats.iterdir() for d in n.iterdir()} if stats.is_dir() else set()

    def wait_windows(self, want):
        wait_for(lambda: want <= self.windows(), "the window's Python stats %s" % sorted(want), alive=self.proc)

    def events(self, name):
        """Every timeline event named ``name``, with its file's node."""
        found = []
        for f in (self.out / "framework" / "pevents").rglob("*.json"):
            node = f.name.split("_")[1]
            for e in json.loads(f.read_text()):
                if e.get("name") == name:
                    found.append((node, e))
        return found


def trigger(trainprof_bin, *args, timeout=120):
    return subprocess.run([str(trainprof_bin), "trigger", *map(str, args)], capture_output=True, text=True,
                          timeout=timeout)


def rank_lines(stdout):
    return {m.group(1): m.group(2) for m in re.finditer(r"^  (\S+): (.*)$", stdout, re.M)}


def test_both_ranks_open_on_the_same_step_a_multiple_of_roundup(tmp_path, trainprof_bin, hook_lib):
    job = Job(tmp_path, trainprof_bin, hook_lib)
    try:
        t = trigger(trainprof_bin, "--detailed", "--python", "--steps", 3, "--roundup", 10, "--wait", 20, job.out)
        assert t.returncode == 0, (t.stdout, t.stderr)
        lines = rank_lines(t.stdout)
        assert len(lines) == 2 and all("reached" in v for v in lines.values()), t.stdout
        ranges = {re.search(r"steps (\d+)\.\.=(\d+)", v).groups() for v in lines.values()}
        assert len(ranges) == 1, t.stdout
        start, last = map(int, ranges.pop())
        assert start % 10 == 0 and last == start + 2
        assert "framework/pytorch/cprofile/" in t.stdout and "framework/pevents/" in t.stdout
        # Each rank's Python stats of the window's three steps appear.
        job.wait_windows({(r, s) for r in ("0", "1") for s in range(start, start + 3)})
        assert {s for _, s in job.windows()} == set(range(start, start + 3)), "only the requested steps"
    finally:
        err = job.finish()
    assert err.count("trainprof trigger") >= 2, err
    events = job.events("trainprof:RequestedWindow")
    assert sorted(n.split("-")[0] for n, _ in events) == ["0", "1"], events
    for _, e in events:
        assert (e["ph"], e["s"]) == ("i", "g")
        a = e["args"]
        assert (a["window_start_step"], a["window_num_steps"], a["features"]) == (start, 3, ["detailed", "python"])
        assert a["step_num"] == str(start)
    detailed = {(n.split("-")[0], int(e["args"]["step_num"])) for n, e in job.events("detailed")}
    assert detailed == {(r, s) for r in ("0", "1") for s in range(start, start + 3)}
    # The report lists the window of each rank, under the request's id.
    r = subprocess.run([str(trainprof_bin), "report", str(job.out), "--json"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    requested = json.loads(r.stdout)["requested"]
    assert sorted(w["rank"].split("-")[0] for w in requested) == ["0", "1"], requested
    assert len({w["request_id"] for w in requested}) == 1
    assert {(w["window_start_step"], w["window_num_steps"]) for w in requested} == {(start, 3)}
    page = tmp_path / "page.html"
    r = subprocess.run([str(trainprof_bin), "report", str(job.out), "-o", str(page)], capture_output=True, text=True)
    assert r.returncode == 0 and "<h2>Requested windows</h2>" in page.read_text(), r.stderr
    # compare leaves the requested window's steps out, as a configured window's (and the
    # step after it, which pays for its teardown): 2 ranks × (3 + 1) steps, and one more per
    # rank where the window's end (the next step's begin) touches that step.
    r = subprocess.run([str(trainprof_bin), "compare", str(job.out), str(job.out), "--json", "--warmup", "0"],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    train = json.loads(r.stdout)["steps"]["TRAIN"]["a"]
    assert 8 <= train["window_left_out"] <= 10 and train["kept"] > 0, train
    assert job.presences() == [], "each rank removes its presence file at exit"
    assert sorted(p.name for p in (job.out / "trigger").iterdir()) == [], "the trigger cleans up"


def test_a_rank_stuck_outside_a_step_is_missed_and_the_other_still_profiles(tmp_path, trainprof_bin, hook_lib):
    job = Job(tmp_path, trainprof_bin, hook_lib, stuck_rank=1)
    try:
        wait_for(lambda: pathlib.Path(str(job.release) + ".waiting").exists(), "rank 1 stuck", alive=job.proc)
        t = trigger(trainprof_bin, "--python", "--steps", 2, "--roundup", 5, "--wait", 6, job.out)
        assert t.returncode == 0, (t.stdout, t.stderr)
        lines = rank_lines(t.stdout)
        (r0,) = [v for k, v in lines.items() if k.startswith("0-")]
        (r1,) = [v for k, v in lines.items() if k.startswith("1-")]
        assert r0.startswith("reached"), t.stdout
        assert r1.startswith("missed: no answer"), t.stdout
        start = int(re.search(r"steps (\d+)", r0).group(1))
        assert start % 5 == 0
        job.wait_windows({("0", start), ("0", start + 1)})
    finally:
        job.finish()
    events = job.events("trainprof:RequestedWindow")
    assert [n.split("-")[0] for n, _ in events] == ["0"], "the stuck rank is never armed late"


def test_no_trainer_running_is_a_clear_error(tmp_path, trainprof_bin):
    t = trigger(trainprof_bin, "--detailed", tmp_path)
    assert t.returncode == 1 and "no trainer running" in t.stderr, t.stderr
    (tmp_path / "trigger").mkdir(mode=0o700)
    t = trigger(trainprof_bin, "--detailed", tmp_path)
    assert t.returncode == 1 and "no trainer running: no rank has announced itself" in t.stderr, t.stderr
    assert list((tmp_path / "trigger").iterdir()) == []


@pytest.mark.parametrize("args, says", [
    ([], "required"),
    (["--detailed", "--steps", "0"], "--steps"),
    (["--detailed", "--roundup", "0"], "--roundup"),
    (["--detailed", "--wait", "0"], "--wait"),
    (["--detailed", "--wait", "nan"], "--wait"),
    (["--detailed", "--wait", "601"], "--wait"),
    (["--memory", "--steps", "0"], "--steps"),
    (["--memory", "--steps", "10001"], "--steps"),
    (["--memory", "--roundup", "0"], "--roundup"),
    (["--memory", "--memory"], "'--memory' cannot be used multiple times"),
    (["--memory=yes"], "unexpected value 'yes' for '--memory'"),
    (["--memroy"], "unexpected argument '--memroy'"),
])
def test_flags_are_checked(tmp_path, trainprof_bin, args, says):
    t = trigger(trainprof_bin, *args, tmp_path)
    assert t.returncode == 2 and says in t.stderr, t.stderr
    assert not (tmp_path / "trigger").exists(), "nothing starts on a flag mistake"


def test_help_names_every_window(trainprof_bin):
    t = subprocess.run([str(trainprof_bin), "trigger", "--help"], capture_output=True, text=True)
    assert t.returncode == 0, t.stderr
    usage = re.search(r"<(--detailed\|[^>]*)>", t.stdout).group(1).split("|")
    assert usage == ["--detailed", "--python", "--dataloader", "--native", "--memory", "--stacks"], usage
    assert "--memory\n          The memory window (PyTorch on CUDA only)" in t.stdout, t.stdout
    assert "framework/memory/<node>/" in t.stdout


def test_an_s3_target_that_cannot_be_used_is_exit_status_2(trainprof_bin):
    # Every node through S3 is tests/s3/test_trigger_s3.py; here, the targets it cannot use.
    t = trigger(trainprof_bin, "--python", "s3:///job")
    assert t.returncode == 2 and "names no bucket" in t.stderr, t.stderr
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    env.update(AWS_ACCESS_KEY_ID="AKIAX", AWS_SECRET_ACCESS_KEY="x", AWS_REGION="us-east-1",
               AWS_EC2_METADATA_DISABLED="true", AWS_CONFIG_FILE=os.devnull, AWS_SHARED_CREDENTIALS_FILE=os.devnull)
    t = subprocess.run([str(trainprof_bin), "trigger", "--python", "--s3-endpoint", "http://127.0.0.1:%d" % port,
                        "s3://bucket/job"], capture_output=True, text=True, timeout=60, env=env)
    assert t.returncode == 2 and "cannot list s3://bucket/job/system/node" in t.stderr, t.stderr


def test_planted_garbage_and_links_are_refused_and_change_nothing(tmp_path, trainprof_bin, hook_lib):
    job = Job(tmp_path, trainprof_bin, hook_lib, ranks=1)
    folder = job.out / "trigger"
    try:
        assert oct(folder.stat().st_mode & 0o777) == "0o700"
        (folder / "request-bad1.json").write_text('{"version": 1, "id": "bad1", "features": [[[[')
        os.symlink("/etc/passwd", folder / "request-link1.json")
        (folder / "request-typo1.json").write_text(json.dumps({
            "version": 1, "id": "typo1", "features": ["python"], "stacks": False, "steps": "3", "roundup": 1,
            "requested_us": 1, "expires_us": 2}))

        def answer(i):
            got = list(folder.glob("ack-%s-*.json" % i))
            return json.loads(got[0].read_text()) if got else None

        wait_for(lambda: all(answer(i) for i in ("bad1", "link1", "typo1")), "the refusals", alive=job.proc)
        assert answer("bad1")["answer"] == "refused" and "ends early" in answer("bad1")["reason"]
        assert answer("link1")["answer"] == "refused" and "not a regular file" in answer("link1")["reason"]
        assert answer("typo1")["answer"] == "refused" and "not the format" in answer("typo1")["reason"]
        # A good request still works afterwards: the refusals changed nothing.
        t = trigger(trainprof_bin, "--python", "--steps", 1, "--wait", 20, job.out)
        assert t.returncode == 0, (t.stdout, t.stderr)
        job.wait_windows({("0", int(re.search(r"steps (\d+)", t.stdout).group(1)))})
    finally:
        err = job.finish()
    assert "refused" in err
    assert len(job.events("trainprof:RequestedWindow")) == 1
    assert (folder / "request-link1.json").is_symlink(), "a planted link is left alone"


def test_profiling_disabled_by_a_reload_is_said(tmp_path, trainprof_bin, hook_lib):
    job = Job(tmp_path, trainprof_bin, hook_lib, ranks=1)
    try:
        cfg = tmp_path / "profilerconfig.json"
        doc = json.loads(cfg.read_text())
        doc["DisableProfiler"] = True
        (tmp_path / "next.json").write_text(json.dumps(doc))
        os.replace(tmp_path / "next.json", cfg)
        # The hook's reload (its trainer takes it at the next step, 20 ms later).
        wait_for(lambda: re.search(r"trainprof-hook\[\d+\]: config changed", job.stderr()), "the hook's reload",
                 alive=job.proc)
        t = trigger(trainprof_bin, "--python", "--wait", 20, job.out)
        assert t.returncode == 1, (t.stdout, t.stderr)
        assert "not reached, disabled: profiling is off in this process" in t.stdout
        assert "no rank was reached (profiling disabled)" in t.stderr
    finally:
        job.finish()


def test_stacks_are_dumped_by_every_rank_the_stuck_one_too_and_the_job_goes_on(tmp_path, trainprof_bin, hook_lib):
    hang = {"HangDetectionConfig": {"HangTimeoutS": 600}}
    job = Job(tmp_path, trainprof_bin, hook_lib, config=hang, stuck_rank=1)
    try:
        wait_for(lambda: pathlib.Path(str(job.release) + ".waiting").exists(), "rank 1 stuck", alive=job.proc)
        t = trigger(trainprof_bin, "--stacks", "--wait", 20, job.out)
        assert t.returncode == 0, (t.stdout, t.stderr)
        lines = rank_lines(t.stdout)
        assert len(lines) == 2 and all(v.startswith("stacks dumped in ") for v in lines.values()), t.stdout
        for v in lines.values():
            folder = pathlib.Path(v.split("stacks dumped in ", 1)[1].rstrip("/"))
            stall = json.loads((folder / "stall.json").read_text())
            assert stall["kind"] == "requested", stall
            assert "trigger_ranks.py" in (folder / "python_stacks.txt").read_text()
            assert (folder / "native_stacks.txt").is_file()
        assert job.proc.poll() is None, "the job goes on"
    finally:
        job.finish()
    r = subprocess.run([str(trainprof_bin), "report", str(job.out), "--json"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    (inc,) = json.loads(r.stdout)["hangs"]["incidents"]
    assert inc["kind"] == "requested" and len(inc["dumps"]) == 2, inc


def test_stacks_without_hang_detection_borrow_nothing_and_leave_every_signal_as_it_was(
        tmp_path, trainprof_bin, hook_lib):
    """No HangDetectionConfig: each rank's stacks still come (the stuck rank's too), from a
    thread that borrows a free real-time signal for the native stacks and gives it back: the
    kernel's view of the ranks' signal dispositions is the same before and after, and the same
    as a Python process's without trainprof."""
    signals_to = tmp_path / "signals"
    job = Job(tmp_path, trainprof_bin, hook_lib, stuck_rank=1, signals_to=str(signals_to))
    try:
        wait_for(lambda: pathlib.Path(str(job.release) + ".waiting").exists(), "rank 1 stuck", alive=job.proc)
        t = trigger(trainprof_bin, "--stacks", "--wait", 20, job.out)
        assert t.returncode == 0, (t.stdout, t.stderr)
        lines = rank_lines(t.stdout)
        assert len(lines) == 2 and all(v.startswith("stacks dumped in ") for v in lines.values()), t.stdout
        for key, v in lines.items():
            folder = pathlib.Path(v.split("stacks dumped in ", 1)[1].rstrip("/"))
            stall = json.loads((folder / "stall.json").read_text())
            assert stall["kind"] == "requested", stall
            py = (folder / "python_stacks.txt").read_text()
            assert "trigger_ranks.py" in py, py
            if key.startswith("1-"):
                assert "waits.py" in py, py  # where the stuck rank waits
            native = (folder / "native_stacks.txt").read_text()
            assert re.search(r"^  #0 0x", native, re.M), native
        assert job.proc.poll() is None, "the job goes on"
    finally:
        job.finish()
    # Without trainprof: a Python process with a second thread (glibc installs its own
    # handler for one internal real-time signal at the first thread, as in every trainer).
    plain = subprocess.run(
        [sys.executable, "-c", "import sys, threading; t = threading.Thread(target=int); t.start(); t.join(); "
         "sys.stdout.write(open('/proc/self/status').read())"],
        capture_output=True, text=True, check=True).stdout
    without = {k: v.strip() for k, v in (line.split(":", 1) for line in plain.splitlines())
               if k in ("SigCgt", "SigIgn", "SigBlk")}
    for rank in (0, 1):
        seen = json.loads(pathlib.Path("%s.%d" % (signals_to, rank)).read_text())
        assert seen["start"] == seen["end"] == without, (rank, seen, without)
    r = subprocess.run([str(trainprof_bin), "report", str(job.out), "--json"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    (inc,) = json.loads(r.stdout)["hangs"]["incidents"]
    assert inc["kind"] == "requested" and len(inc["dumps"]) == 2, inc


@pytest.mark.skipif(os.geteuid() != 0, reason="acting as another user needs root")
def test_another_user_is_not_allowed_and_nothing_changes(tmp_path, trainprof_bin, hook_lib):
    """A real second user (uid 65534, through setpriv) runs `trainprof trigger` against a
    root trainer's LocalPath that it can read: refused (exit 1, `not allowed`), no file
    added to the trigger folder, no window opened."""
    base = pathlib.Path(tempfile.mkdtemp(prefix="trainprof-trigger-"))
    try:
        base.chmod(0o755)
        binary = base / "trainprof"
        shutil.copy(trainprof_bin, binary)
        job = Job(base, trainprof_bin, hook_lib, ranks=1)
        try:
            job.out.chmod(0o755)
            before = sorted(p.name for p in (job.out / "trigger").iterdir())
            t = subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", str(binary),
                                "trigger", "--python", "--wait", "3", str(job.out)],
                               capture_output=True, text=True, timeout=60)
            assert t.returncode == 1, (t.stdout, t.stderr)
            assert "not allowed" in t.stderr, t.stderr
            assert sorted(p.name for p in (job.out / "trigger").iterdir()) == before
        finally:
            job.finish()
        assert job.windows() == set(), "no window opened"
        assert not job.events("trainprof:RequestedWindow")
    finally:
        shutil.rmtree(base, ignore_errors=True)


def test_stacks_without_hang_detection_leave_a_signal_the_trainer_owns_to_it(tmp_path, trainprof_bin, hook_lib):
    """The trainer holds its own handler on the first real-time signal trainprof would borrow:
    the stacks still come, the borrowed signal is another one, and the trainer's handler is
    still installed and runs afterwards, as without trainprof."""
    signals_to = tmp_path / "signals"
    job = Job(tmp_path, trainprof_bin, hook_lib, ranks=1, own_rt=True, signals_to=str(signals_to))
    try:
        t = trigger(trainprof_bin, "--stacks", "--wait", 20, job.out)
        assert t.returncode == 0, (t.stdout, t.stderr)
        (v,) = rank_lines(t.stdout).values()
        assert v.startswith("stacks dumped in "), t.stdout
        folder = pathlib.Path(v.split("stacks dumped in ", 1)[1].rstrip("/"))
        assert re.search(r"^  #0 0x", (folder / "native_stacks.txt").read_text(), re.M)
    finally:
        job.finish()
    seen = json.loads(pathlib.Path("%s.0" % signals_to).read_text())
    assert seen["own_rt_installed"] and seen["own_rt_ran"], seen
    assert seen["start"] == seen["end"], seen
