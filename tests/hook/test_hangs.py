"""The flight recorder (``HangDetectionConfig``; docs/formats.md, "Hang and crash dumps"):
real trainers (tests/hook/scripts/hang_trainer.py) that deadlock, block in C, crash, raise or
are killed in step 30, each run with the hook and, for the exit status, without it."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest
from conftest import SCRIPTS
from smdebug.profiler.algorithm_metrics_reader import LocalAlgorithmMetricsReader
from trainer_runs import CLEARED_ENV, PACKAGE_DIR, profiler_config

HANG = {"HangDetectionConfig": {"HangTimeoutS": 1}}


def dumps(out):
    """The complete dump folders (with stall.json), by name."""
    root = out / "framework" / "hangs"
    return sorted(p.parent for p in root.glob("*/*/stall.json"))


def stall(folder):
    return json.loads((folder / "stall.json").read_text())


def smdebug_steps(out):
    """The train step numbers smdebug 1.0.34's reader finds in the timeline files (it walks
    the whole framework folder and skips the dump files as not its own)."""
    events = LocalAlgorithmMetricsReader(trace_root_folder=str(out)).get_events(0, 10**18)
    return sorted(int(e.event_args["step_num"]) for e in events if e.event_phase == "Step:ModeKeys.TRAIN")


def run_both(run_script, how, **params):
    """The run with hang detection on, and the same script without profiling."""
    p = dict(params, how=how)
    on = run_script("hang_trainer.py", p, config=HANG, timeout=90)
    off = run_script("hang_trainer.py", p, config=None, timeout=90)
    return on, off


def test_a_lock_deadlock_in_step_30_is_dumped_once_and_its_end_recorded(run_script):
    on, off = run_both(run_script, "lock", release_s=3.5)
    assert on.proc.returncode == off.proc.returncode == 0, on.proc.stderr
    [d] = dumps(on.out)
    s = stall(d)
    assert (s["version"], s["kind"], s["step"], s["mode"], s["last_completed_step"]) == (1, "stall", 30, "train", 29)
    assert s["threshold_s"] == 1 and 0 < s["median_step_s"] < 0.5
    steps = [e for e in s["ring"] if e["what"].startswith("step_")]
    assert steps[-1] == {"t_us": s["step_started_us"], "what": "step_start", "name": "Step:ModeKeys.TRAIN", "step": 30}
    assert len(steps) <= 256 and s["signal"] is None
    # The last events recorded (phases, each a start and an end), after the steps: step 30's
    # Forward ended before its step hung.
    phases = [e for e in s["ring"] if e["what"].startswith("phase_")]
    assert 0 < len(phases) <= 512 and len(phases) % 2 == 0
    assert phases[-2:] == [
        {"t_us": phases[-2]["t_us"], "what": "phase_start", "name": "Net", "phase": "Forward", "step": 30},
        {"t_us": phases[-1]["t_us"], "what": "phase_end", "name": "Net", "phase": "Forward", "step": 30},
    ]
    assert s["step_started_us"] <= phases[-2]["t_us"] < phases[-1]["t_us"] < s["detected_us"]
    assert d.name.startswith("30-")
    py = (d / "python_stacks.txt").read_text()
    assert "(most recent call first)" in py
    assert "lock.acquire(timeout=RELEASE_S)" not in py  # faulthandler names the line, not its text
    line = next(i for i, t in enumerate((SCRIPTS / "hang_trainer.py").read_text().splitlines(), 1) if "lock.acquire(timeout" in t)
    assert f'hang_trainer.py", line {line} in go_wrong' in py
    native = (d / "native_stacks.txt").read_text()
    assert native.startswith("thread ") and "trainprof-write" in native
    assert "native_handler" not in native, "the handler's own frames are cut"
    ended = json.loads((d / "ended.json").read_text())
    assert 3.0 <= ended["stalled_s"] < 10 and ended["ended_us"] > s["detected_us"]
    # Nothing else under the node's folder (a crash's dump is prepared in memory).
    assert not list((on.out / "framework" / "hangs").glob("*/.*"))
    # smdebug still reads the timeline: every step, the stalled one included.
    assert smdebug_steps(on.out) == list(range(40))


def test_a_thread_blocked_in_a_c_read_shows_read_in_its_native_stack(run_script):
    on, off = run_both(run_script, "cread", release_s=3.0)
    assert on.proc.returncode == off.proc.returncode == 0, on.proc.stderr
    [d] = dumps(on.out)
    assert stall(d)["step"] == 30
    native = (d / "native_stacks.txt").read_text()
    main = native.split("\n\n")[0]
    assert "read" in main, native[:2000]
    assert "hang_trainer.py" in (d / "python_stacks.txt").read_text()


def test_a_segfault_leaves_python_stacks_and_the_same_exit_status(run_script):
    on, off = run_both(run_script, "segv")
    assert on.proc.returncode == off.proc.returncode == -signal.SIGSEGV, on.proc.stderr
    [d] = dumps(on.out)
    s = stall(d)
    assert (s["kind"], s["signal"], s["step"]) == ("fatal", "SIGSEGV", 30)
    py = (d / "python_stacks.txt").read_text()
    # faulthandler's stacks, through the package's registration (the signal is stall.json's).
    assert "Current thread" in py and "in string_at" in py and "in go_wrong" in py
    assert (d / "native_stacks.txt").read_text().startswith("thread ")
    assert not list((on.out / "framework" / "hangs").glob("*/.*"))


@pytest.mark.parametrize("how, status", [("raise", 1), ("thread_raise", 0)])
def test_an_uncaught_exception_leaves_its_traceback_and_the_same_exit_status(run_script, how, status):
    on, off = run_both(run_script, how)
    assert on.proc.returncode == off.proc.returncode == status
    assert "RuntimeError: boom in step 30" in on.proc.stderr, "the trainer's own excepthook still prints"
    [d] = dumps(on.out)
    s = stall(d)
    assert (s["kind"], s["step"]) == ("exception", 30)
    tb = (d / "traceback.txt").read_text()
    assert tb.startswith("Traceback (most recent call last):") and "RuntimeError: boom in step 30" in tb


def run_killed(work, hook_lib, params, config, sig=signal.SIGTERM, delay_s=0.3):
    """Starts the trainer, sends ``sig`` ``delay_s`` after it waits in step 30; (returncode,
    stdout, stderr, LocalPath). ``config`` None: no profiling."""
    work.mkdir(parents=True)
    out = work / "out"
    env = {k: v for k, v in os.environ.items() if k not in CLEARED_ENV}
    env.update(PYTHONPATH=str(PACKAGE_DIR), TRAINPROF_HOOK_LIB=str(hook_lib), TRAINPROF_TEST_PARAMS=json.dumps(params))
    env["TRAINPROF_RESOURCE_CONFIG"] = str(work / "none.json")
    env["SMPROFILER_CONFIG_PATH"] = str(work / "none.json")
    if config is not None:
        path = work / "profilerconfig.json"
        path.write_text(json.dumps(profiler_config(out, **config)))
        env["SMPROFILER_CONFIG_PATH"] = str(path)
    p = subprocess.Popen(
        [sys.executable, str(SCRIPTS / "hang_trainer.py")],
        env=env,
        cwd=str(work),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        # At its default action whatever this suite inherited (a background job of a
        # non-interactive shell has SIGINT ignored, and Python then installs no handler).
        preexec_fn=lambda: signal.signal(sig, signal.SIG_DFL),
    )
    try:
        assert p.stdout.readline().strip() == "waiting"
        time.sleep(delay_s)  # mid-step
        p.send_signal(sig)
        stdout, stderr = p.communicate(timeout=30)
    finally:
        if p.poll() is None:
            p.kill()
            p.communicate()
    return p.returncode, stdout, stderr, out


@pytest.mark.parametrize(
    "own, after, sig",
    [
        (False, False, signal.SIGTERM),
        (True, False, signal.SIGTERM),
        (True, True, signal.SIGTERM),
        (False, False, signal.SIGINT),
    ],
    ids=["default-action", "own-handler", "own-handler-installed-later", "sigint-keyboardinterrupt"],
)
def test_a_signal_mid_step_is_dumped_and_the_exit_status_and_own_handler_are_kept(tmp_path, hook_lib, own, after, sig):
    params = {"how": "sigterm", "own_handler": own, "handler_after": after}
    # A handler installed after the profiler started is wrapped by the watchdog within a
    # second: the signal comes later, with a timeout that no stall reaches first.
    config, delay = ({"HangDetectionConfig": {"HangTimeoutS": 60}}, 1.5) if after else (HANG, 0.3)
    rc, stdout, stderr, out = run_killed(tmp_path / "on", hook_lib, params, config, sig, delay)
    rc_off, stdout_off, _, _ = run_killed(tmp_path / "off", hook_lib, params, None, sig, delay)
    expected = 3 if own else -sig
    assert rc == rc_off == expected, stderr
    assert ("own handler ran" in stdout) == ("own handler ran" in stdout_off) == own
    [d] = dumps(out)
    s = stall(d)
    name = "SIGTERM" if sig == signal.SIGTERM else "SIGINT"
    assert (s["kind"], s["signal"], s["step"], s["threshold_s"]) == ("signal", name, 30, None)
    assert s["step_started_us"] is not None and s["last_completed_step"] == 29
    assert "in go_wrong" in (d / "python_stacks.txt").read_text()
    assert "thread " in (d / "native_stacks.txt").read_text()
    if sig == signal.SIGINT:
        assert "KeyboardInterrupt" in stderr


def test_a_forked_child_killed_by_sigterm_dies_at_once_and_writes_nothing(run_script):
    on, off = run_both(run_script, "fork")
    assert on.proc.returncode == off.proc.returncode == 0, on.proc.stderr
    for run in (on, off):
        [line] = [x for x in run.proc.stdout.splitlines() if x.startswith("child ")]
        _, status, seconds = line.split()
        assert int(status) == -signal.SIGTERM and float(seconds) < 1.0, line
    assert dumps(on.out) == []


def test_two_ranks_one_stops_stepping_the_other_waits_in_the_collective(tmp_path, hook_lib):
    """Rank 1 stops in step 30; rank 0 waits for it in step 31: each rank dumps its own stall,
    and the dumps say which rank is behind (the lowest last completed step)."""
    fifo = tmp_path / "allreduce.fifo"
    os.mkfifo(fifo)
    out = tmp_path / "out"
    config = tmp_path / "profilerconfig.json"
    config.write_text(json.dumps(profiler_config(out, **HANG)))
    procs = []
    for rank in (0, 1):
        env = {k: v for k, v in os.environ.items() if k not in CLEARED_ENV}
        env.update(
            PYTHONPATH=str(PACKAGE_DIR),
            TRAINPROF_HOOK_LIB=str(hook_lib),
            TRAINPROF_TEST_PARAMS=json.dumps({"fifo": str(fifo), "release_s": 3.5}),
            TRAINPROF_RESOURCE_CONFIG=str(tmp_path / "none.json"),
            SMPROFILER_CONFIG_PATH=str(config),
            RANK=str(rank),
        )
        procs.append(
            subprocess.Popen(
                [sys.executable, str(SCRIPTS / "hang_ranks.py")],
                env=env,
                cwd=str(tmp_path),
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
        )
    results = [p.communicate(timeout=60) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], results
    by_rank = {}
    for d in dumps(out):
        s = stall(d)
        by_rank[s["node"].split("-")[0]] = s
        assert d.parent.name == s["node"]
        assert (d / "ended.json").is_file()
    assert set(by_rank) == {"0", "1"}, by_rank.keys()
    r0, r1 = by_rank["0"], by_rank["1"]
    assert (r0["kind"], r0["step"], r0["last_completed_step"]) == ("stall", 31, 30)
    assert (r1["kind"], r1["step"], r1["last_completed_step"]) == ("stall", 30, 29)
    # Rank 0's Python stack is in the collective's read; rank 1's on its lock.
    d0, d1 = (next(d for d in dumps(out) if stall(d)["node"].startswith(r)) for r in ("0-", "1-"))
    assert "hang_ranks.py" in (d0 / "python_stacks.txt").read_text()

    def line(text):
        return next(i for i, t in enumerate((SCRIPTS / "hang_ranks.py").read_text().splitlines(), 1) if text in t)

    assert 'line %d in <module>' % line("os.read(fd, 1)") in (d0 / "python_stacks.txt").read_text()
    assert 'line %d in <module>' % line("lock.acquire(timeout") in (d1 / "python_stacks.txt").read_text()
    assert "read" in (d0 / "native_stacks.txt").read_text().split("\n\n")[0]


@pytest.mark.parametrize("how, status", [("lock", 0), ("segv", -signal.SIGSEGV)])
def test_a_planted_link_is_not_followed_and_changes_nothing(tmp_path, hook_lib, how, status):
    """``framework/hangs`` planted as a link to a folder elsewhere: no dump is written through
    it (one log line), and the trainer's exit status is unchanged."""
    out = tmp_path / "out"
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (out / "framework").mkdir(parents=True)
    (out / "framework" / "hangs").symlink_to(elsewhere)
    config = tmp_path / "profilerconfig.json"
    config.write_text(json.dumps(profiler_config(out, **HANG)))
    env = {k: v for k, v in os.environ.items() if k not in CLEARED_ENV}
    env.update(
        PYTHONPATH=str(PACKAGE_DIR),
        TRAINPROF_HOOK_LIB=str(hook_lib),
        # No dump can be written here: the lock is released after release_s alone.
        TRAINPROF_TEST_PARAMS=json.dumps({"how": how, "release_s": 2.5, "wait_dump": False}),
        TRAINPROF_RESOURCE_CONFIG=str(tmp_path / "none.json"),
        SMPROFILER_CONFIG_PATH=str(config),
    )
    p = subprocess.run(
        [sys.executable, str(SCRIPTS / "hang_trainer.py")], env=env, cwd=str(tmp_path), capture_output=True, text=True, timeout=60
    )
    assert p.returncode == status, p.stderr
    assert list(elsewhere.iterdir()) == []
    assert "hang detection: cannot prepare a crash dump: " in p.stderr, p.stderr
    assert "hangs is a symbolic link (not followed)" in p.stderr, p.stderr
    if how == "lock":
        assert "hang detection: cannot write framework/hangs/" in p.stderr, p.stderr


def test_off_unless_configured(run_script):
    run = run_script("hang_trainer.py", {"how": "raise"}, config={}, timeout=60)
    assert run.proc.returncode == 1
    assert not (run.out / "framework" / "hangs").exists()
