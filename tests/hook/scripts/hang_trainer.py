"""A trainer that goes wrong in step 30, for the hang and crash tests (tests/hook/test_hangs.py).

TRAINPROF_TEST_PARAMS: ``{"how": ..., "release_s": float, "own_handler": bool, "wait_dump": bool}``,
``how`` one of

* ``lock``: blocks on a ``threading.Lock`` it already holds (released after ``release_s`` by a
  timed acquire, and once the watchdog's dump is there, so the step ends and the process
  exits normally);
* ``cread``: blocks in the C library's ``read`` on a pipe (through ctypes), which a helper thread
  writes to after ``release_s`` and once the watchdog's dump is there;
* ``segv``: ``ctypes.string_at(0)``;
* ``raise``: raises ``RuntimeError("boom in step 30")``; ``thread_raise``: the same in a
  thread of its own (joined; the process goes on and exits 0);
* ``fork``: forks a child (a DataLoader worker's way) that sleeps, SIGTERMs it and prints
  ``child <status> <seconds>`` (the child's wait status as ``os.waitstatus_to_exitcode``);
* ``sigterm``: prints ``waiting`` and sleeps in step 30 until a signal comes; with
  ``own_handler`` its own SIGTERM handler (installed before the profiler starts, or after
  with ``handler_after``) prints ``own handler ran`` and exits 3.

Steps last 5 ms. With profiling off (no config) the package does nothing: the same script is
the baseline for the exit status."""

import ctypes
import json
import os
import signal
import sys
import threading
import time

import trainprof
import waits

PARAMS = json.loads(os.environ.get("TRAINPROF_TEST_PARAMS") or "{}")
HOW = PARAMS.get("how", "lock")
RELEASE_S = float(PARAMS.get("release_s", 3.0))



def on_term(signum, frame):
    print("own handler ran", flush=True)
    sys.exit(3)


if PARAMS.get("own_handler") and not PARAMS.get("handler_after"):
    signal.signal(signal.SIGTERM, on_term)

lock = threading.Lock()


def dumped():
    """Waits for the watchdog's dump of the stall (not with ``"wait_dump": false``: a dump
    that cannot be written)."""
    if PARAMS.get("wait_dump", True):
        waits.wait_for_dumps(1)


def go_wrong():
    if HOW == "lock":
        lock.acquire()
        lock.acquire(timeout=RELEASE_S)  # the deadlock (for RELEASE_S)
        dumped()  # and until the watchdog has dumped it
    elif HOW == "cread":
        r, w = os.pipe()

        def release():
            dumped()  # the watchdog has dumped the stall
            os.write(w, b"x")

        threading.Timer(RELEASE_S, release).start()
        libc = ctypes.CDLL(None, use_errno=True)
        buf = ctypes.create_string_buffer(1)
        libc.read(r, buf, 1)
    elif HOW == "segv":
        ctypes.string_at(0)
    elif HOW == "raise":
        raise RuntimeError("boom in step 30")
    elif HOW == "thread_raise":

        def worker():
            raise RuntimeError("boom in step 30")

        t = threading.Thread(target=worker, name="worker")
        t.start()
        t.join()
    elif HOW == "fork":
        # The child says it runs (the fork's handlers done) on a pipe; its sleep is only
        # the failure bound, ended by the SIGTERM.
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.write(w, b"x")
            time.sleep(30)
            os._exit(0)
        os.read(r, 1)
        t0 = time.monotonic()
        os.kill(pid, signal.SIGTERM)
        _, status = os.waitpid(pid, 0)
        print("child %d %.2f" % (os.waitstatus_to_exitcode(status), time.monotonic() - t0), flush=True)
    elif HOW == "sigterm":
        print("waiting", flush=True)
        for _ in range(600):
            time.sleep(0.1)


prof = trainprof.Profiler(framework="pytorch")
if PARAMS.get("own_handler") and PARAMS.get("handler_after"):
    signal.signal(signal.SIGTERM, on_term)
for step in range(40):
    prof.step_begin("train")
    with prof.record("Forward", "Net"):
        time.sleep(0.005)
    if step == 30:
        go_wrong()
    prof.step_end()
prof.close()
print("done", flush=True)
