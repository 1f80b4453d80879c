"""`trainprof run` in a terminal (a pty, `run` its session leader as under `docker run -it`
or `ssh -t host trainprof run ...`): the command holds the terminal's foreground, so
Ctrl-C reaches it once and never `run`, it reads lines from the terminal (what pdb
needs), Ctrl-Z does not leave it stopped, and a hang-up reaches it once and `run` ends
as usual (docs/run.md, "Signals")."""

import json
import os
import select
import signal
import sys
import threading
import time

import pytest

# Counts SIGINT / SIGHUP in a JSON file (SIGHUP ends it with 4). "read": reads two lines
# from the terminal, recorded, then exits 3. "wait": waits for a signal.
COMMAND = r"""
import json, os, signal, sys, time
out, mode = sys.argv[1], sys.argv[2]
state = {"ready": 1}
def dump():
    open(out + ".part", "w").write(json.dumps(state))
    os.rename(out + ".part", out)
def on(sig, frame):
    name = signal.Signals(sig).name
    state[name] = state.get(name, 0) + 1
    dump()
    if sig == signal.SIGHUP:
        sys.exit(4)
signal.signal(signal.SIGINT, on)
signal.signal(signal.SIGHUP, on)
dump()
if mode == "read":
    for n in range(2):
        state["line%d" % n] = sys.stdin.readline().strip()
        dump()
    sys.exit(3)
t = time.time()
while time.time() - t < 60:
    time.sleep(0.05)
sys.exit(9)
"""

LIMIT_S = 60


def wait_for(what, cond):
    t0 = time.monotonic()
    while not cond():
        assert time.monotonic() - t0 < LIMIT_S, f"timed out waiting for {what}"
        time.sleep(0.02)


class Terminal:
    """`trainprof run ... -- python COMMAND <counts> <mode>` on a new pty."""

    def __init__(self, trainprof_bin, tmp_path, mode):
        self.counts_path = tmp_path / "counts.json"
        self.out = tmp_path / "out"
        env = {k: v for k, v in os.environ.items() if not k.startswith(("TRAINPROF_", "SMPROFILER_"))}
        env["TRAINPROF_RESOURCE_CONFIG"] = str(tmp_path / "no-resourceconfig.json")
        env["SMPROFILER_CONFIG_PATH"] = str(tmp_path / "no-profilerconfig.json")
        argv = [str(trainprof_bin), "run", "--interval-ms", "100", "--local-path", str(self.out), "--",
                sys.executable, "-c", COMMAND, str(self.counts_path), mode]
        self.pid, self.fd = os.forkpty()
        if self.pid == 0:
            try:
                os.execve(argv[0], argv, env)
            finally:
                os._exit(127)
        self.output = bytearray()
        self.stop = threading.Event()
        self.reader = threading.Thread(target=self._drain, daemon=True)
        self.reader.start()

    def _drain(self):
        # Never blocked in read: a descriptor being read is not released by close, and
        # the hang-up test needs the close to hang the terminal up.
        while not self.stop.is_set():
            if not select.select([self.fd], [], [], 0.05)[0]:
                continue
            try:
                data = os.read(self.fd, 4096)
            except OSError:
                return
            if not data:
                return
            self.output += data

    def close(self):
        """Closes the terminal's master side: a hang-up."""
        self.stop.set()
        self.reader.join()
        os.close(self.fd)

    def counts(self):
        try:
            return json.loads(self.counts_path.read_text())
        except (FileNotFoundError, ValueError):
            return {}

    def text(self):
        return self.output.decode(errors="replace")

    def wait(self):
        """run's exit status, killing it on the time limit."""
        t0 = time.monotonic()
        while True:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                return os.waitstatus_to_exitcode(status)
            if time.monotonic() - t0 > LIMIT_S:
                os.kill(self.pid, signal.SIGKILL)
                os.waitpid(self.pid, 0)
                pytest.fail(f"trainprof run did not end:\n{self.text()}")
            time.sleep(0.02)


def sealed(out):
    return (out / "system" / "training_job_end.ts").is_file() and not any(
        p.name.endswith(".tmp") for p in out.rglob("*")
    )


def test_ctrl_c_reaches_the_command_once_and_it_reads_the_terminal(trainprof_bin, tmp_path):
    t = Terminal(trainprof_bin, tmp_path, "read")
    try:
        wait_for("the command", lambda: t.counts().get("ready"))
        os.write(t.fd, b"first line\n")
        wait_for("the first line", lambda: "line0" in t.counts())
        assert t.counts()["line0"] == "first line"
        os.write(t.fd, b"\x03")
        wait_for("SIGINT at the command", lambda: t.counts().get("SIGINT"))
        # Ctrl-Z: the command stops; run (here with no job-control shell above it to
        # resume it) takes it as stopped and continued, and the command goes on.
        os.write(t.fd, b"\x1a")
        wait_for("the stop to be seen", lambda: "stopped (SIGTSTP)" in t.text())
        os.write(t.fd, b"second line\n")
        code = t.wait()
    finally:
        t.close()
    text = t.text()
    assert code == 3, text
    counts = t.counts()
    assert counts.get("SIGINT") == 1, (counts, text)
    assert counts.get("line1") == "second line", (counts, text)
    # The terminal's SIGINT went to the command's group only: run never had it to pass on.
    assert "passed on" not in text, text
    assert sealed(t.out), text


def test_a_hang_up_reaches_the_command_once_and_run_ends_as_usual(trainprof_bin, tmp_path):
    t = Terminal(trainprof_bin, tmp_path, "wait")
    wait_for("the command", lambda: t.counts().get("ready"))
    # The terminal goes away: the kernel sends SIGHUP to its session leader, run, which
    # passes it on to the command's group.
    t.close()
    code = t.wait()
    counts = t.counts()
    assert code == 4, counts
    assert counts.get("SIGHUP") == 1, counts
    assert "SIGINT" not in counts
    assert sealed(t.out)
