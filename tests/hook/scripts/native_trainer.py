"""A trainer whose hot loop is a C function (tests/hook/c/hot_loop.c, loaded with ctypes),
run in a subprocess by tests/hook/test_native.py and bench/native_overhead.py.

TRAINPROF_TEST_PARAMS (JSON):
  hot_lib       path of the built hot_loop.c library (required)
  steps         number of train steps (default 12)
  cpu_ms        CPU time of the hot loop per step, in ms (default 40)
  iterations    loop iterations per step (default: calibrated to cpu_ms in this process)
  work          "c" (the C hot loop, default) or "python" (a pure-Python loop of the same
                CPU time: deeper native stacks, through the interpreter)
  own_sigprof   install a Python SIGPROF handler before the first step (default false)
  fork_at       fork() at the start of this step; the child runs one step's loop and
                exits through sys.exit (its atexit handlers run), the parent waits for it
  settle_s      seconds to sleep before the first step (default 0): room for the sampler
                thread's one-time warm-up (docs/formats.md "Native profiling")
  exec_at       at the start of this step, ``exec_how`` ``execv`` replaces the process with
                ``exec_args`` (argv, the first its path); ``fork-execv`` does that in a
                forked child and waits for it (its status goes to ``child_status``);
                first it waits until the native window's SIGPROF handler is installed

The manifest (TRAINPROF_TEST_MANIFEST) gets each step's wall time, the window answers, and
for own_sigprof whether the handler is still this script's and still runs.
"""

import ctypes
import json
import os
import signal
import sys
import time

import trainprof

PARAMS = json.loads(os.environ.get("TRAINPROF_TEST_PARAMS") or "{}")
MANIFEST = os.environ["TRAINPROF_TEST_MANIFEST"]
hot = ctypes.CDLL(PARAMS["hot_lib"])
hot.trainprof_hot_c_loop.argtypes = [ctypes.c_ulong]
hot.trainprof_hot_c_loop.restype = ctypes.c_ulong

calls = []


def own_handler(signum, frame):
    calls.append(signum)


if PARAMS.get("own_sigprof"):
    signal.signal(signal.SIGPROF, own_handler)


def sigprof_handler():
    """SIGPROF's handler as sigaction reads it (0 SIG_DFL, 1 SIG_IGN, else a function)."""
    sa = (ctypes.c_void_p * 40)()  # room for any struct sigaction; the handler comes first
    ctypes.CDLL(None).sigaction(signal.SIGPROF, None, sa)
    return sa[0] or 0


def py_loop(n):
    acc = 1
    for i in range(n):
        acc = (acc * 31 + i) & 0xFFFFFFFF
    return acc


work = hot.trainprof_hot_c_loop if PARAMS.get("work", "c") == "c" else py_loop


def calibrate(cpu_ms):
    """Loop iterations that take about cpu_ms of CPU time."""
    n = 10_000
    while True:
        t0 = time.process_time()
        work(n)
        dt = time.process_time() - t0
        if dt > 0.02:
            return max(1, int(n * cpu_ms / 1000.0 / dt))
        n *= 2


iterations = PARAMS.get("iterations") or calibrate(PARAMS.get("cpu_ms", 40))
prof = trainprof.Profiler("pytorch", strict=True)
manifest = {"step_s": [], "step_cpu_s": [], "pid": os.getpid()}
time.sleep(PARAMS.get("settle_s", 0))
for step in range(PARAMS.get("steps", 12)):
    if step == PARAMS.get("fork_at"):
        pid = os.fork()
        if pid == 0:
            work(iterations)
            sys.exit(0)
        manifest["child_status"] = os.waitpid(pid, 0)[1]
    if step == PARAMS.get("exec_at"):
        # The window opened at an earlier step; the sampler thread starts it once its
        # warm-up is over: wait until its SIGPROF handler is there, then work inside it.
        for _ in range(6000):
            if sigprof_handler() not in (0, 1):
                break
            time.sleep(0.01)
        work(iterations)
        args = PARAMS["exec_args"]
        if PARAMS.get("exec_how") == "execv":
            os.execv(args[0], args)
        pid = os.fork()
        if pid == 0:
            os.execv(args[0], args)
        manifest["child_status"] = os.waitpid(pid, 0)[1]
    t0, c0 = time.perf_counter(), time.thread_time()
    prof.step_begin("train")
    work(iterations)
    prof.step_end()
    # The signal handler runs on the interrupted thread: its cost is in this thread's CPU time.
    manifest["step_cpu_s"].append(time.thread_time() - c0)
    manifest["step_s"].append(time.perf_counter() - t0)
prof.close()
if PARAMS.get("own_sigprof"):
    manifest["handler_kept"] = signal.getsignal(signal.SIGPROF) is own_handler
    os.kill(os.getpid(), signal.SIGPROF)
    time.sleep(0.05)
    manifest["handler_calls"] = len(calls)
with open(MANIFEST, "w") as f:
    json.dump(manifest, f)
