"""A trainer whose C libraries use signals (tests/hook/c/signal_guest.c), for
tests/hook/test_signals.py: each case runs with the profiler on and, for the baseline, with
no config (the package does nothing). It prints ``key value`` lines the test compares.

TRAINPROF_TEST_PARAMS: ``{"lib": path of the built library, "how": ...}``, ``how`` one of

* ``runtime``: a runtime's SIGSEGV handler, installed before the profiler, fixes a fault on a
  guard page (``runtime_touch``); with ``give_back`` the handler gives every fault back (the
  process dies of it); with ``faulthandler`` the trainer enabled ``faulthandler`` itself
  (before the profiler), and a plain segfault follows;
* ``ticker``: a POSIX timer ticks on ``SIGRTMIN + 4`` every 10 ms with the library's handler,
  started before the profiler; prints the ticks counted while 50 more are awaited;
* ``late_rt``: handlers installed after the profiler started on ``SIGRTMIN + 4`` and, after
  the first stall's dump, on ``SIGRTMAX - 4``; steps 30 and 33 stall (``HangTimeoutS`` 1);
  prints how often each handler ran;
* ``oneshot``: a one-shot SIGTERM handler with a mask (``SA_RESETHAND``), installed before the
  profiler; the trainer sends itself SIGTERM twice, the second must kill it;
* ``jumper``: a runtime's SIGSEGV handler (``SA_NODEFER``) leaves every fault by
  ``siglongjmp``; three faults are trapped;
* ``abort``, ``kill_segv``: ``abort()`` / ``os.kill(getpid(), SIGSEGV)`` in step 10 (a signal
  sent, not a fault);
* ``ignored_fpe``: SIGFPE ignored before the profiler, then sent: nothing happens;
* ``borrow``: a library installs its own SIGINT handler for 2.5 s and puts the saved one back;
  then SIGINT must raise ``KeyboardInterrupt`` (Python's handler), not call the removed one;
* ``sigwait``: the main thread blocks SIGTERM after the profiler started and a thread waits
  for it with ``sigwait``, then exits 5 (``os._exit``); the trainer sends SIGTERM to itself.
"""

import ctypes
import faulthandler
import json
import os
import signal
import threading
import time

import trainprof
import waits

PARAMS = json.loads(os.environ.get("TRAINPROF_TEST_PARAMS") or "{}")
HOW = PARAMS["how"]
lib = ctypes.CDLL(PARAMS["lib"])


def say(key, value):
    print("%s %s" % (key, value), flush=True)


def wait_for(what, bound_s=20.0):
    """Waits until ``what()`` is true, at most ``bound_s`` (then goes on: the test fails on
    what is printed, never hangs)."""
    t0 = time.monotonic()
    while not what() and time.monotonic() - t0 < bound_s:
        time.sleep(0.01)
    return what()


if HOW == "runtime":
    if PARAMS.get("faulthandler"):
        faulthandler.enable()
    else:
        lib.runtime_install(int(bool(PARAMS.get("give_back"))))
elif HOW == "ticker":
    assert lib.ticker_start(4, 10) == 0
elif HOW == "oneshot":
    assert lib.oneshot_install() == 0
elif HOW == "jumper":
    assert lib.jumper_install() == 0
elif HOW == "ignored_fpe":
    signal.signal(signal.SIGFPE, signal.SIG_IGN)
elif HOW == "borrow":
    # Python's own SIGINT handler, which a trainer has unless it started with SIGINT ignored
    # (a background job): the test is about giving it back.
    signal.signal(signal.SIGINT, signal.default_int_handler)

prof = trainprof.Profiler(framework="pytorch")

if HOW == "sigwait":
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})

    def waiter():
        signal.sigwait({signal.SIGTERM})
        say("sigwait", "got SIGTERM")
        os._exit(5)

    threading.Thread(target=waiter, daemon=True).start()
elif HOW == "late_rt":
    first = lib.counter_install(4)
    second = None

for step in range(40):
    prof.step_begin("train")
    with prof.record("Forward", "Net"):
        time.sleep(0.002)
    if step == 10:
        if HOW == "runtime":
            if PARAMS.get("faulthandler"):
                ctypes.string_at(0)
            say("touched", lib.runtime_touch())
            say("fixed", lib.runtime_faults_fixed())
            say("si_code", lib.runtime_last_code())
        elif HOW == "ticker":
            before = lib.ticker_ticks()
            wait_for(lambda: lib.ticker_ticks() >= before + 50)
            say("ticks", lib.ticker_ticks() - before)
            say("installed", lib.ticker_handler_installed(4))
        elif HOW == "oneshot":
            os.kill(os.getpid(), signal.SIGTERM)
            say("calls", lib.oneshot_calls_n())
            say("mask", lib.oneshot_mask_seen())
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(1)
            say("survived", "second SIGTERM")
        elif HOW == "borrow":
            assert lib.sigint_borrow(2500) == 0
            try:
                os.kill(os.getpid(), signal.SIGINT)
                time.sleep(6)
                say("interrupted", "no")
            except KeyboardInterrupt:
                say("interrupted", "yes")
            say("borrowed_calls", lib.sigint_borrowed_calls())
        elif HOW == "jumper":
            say("trapped", lib.jumper_trap(3))
        elif HOW == "abort":
            ctypes.CDLL(None).abort()
        elif HOW == "kill_segv":
            os.kill(os.getpid(), signal.SIGSEGV)
            time.sleep(5)
        elif HOW == "ignored_fpe":
            os.kill(os.getpid(), signal.SIGFPE)
            say("ignored", "SIGFPE")
        elif HOW == "sigwait":
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(5)
            say("sigwait", "nobody took it")
    if HOW == "late_rt" and step in (30, 33):
        # A stall (HangTimeoutS 1): the watchdog, which looks once a second, dumps once in it;
        # the step ends once that dump is there (profiling off: nothing dumps, nothing to
        # wait for).
        waits.wait_for_dumps(1 if step == 30 else 2)
        if step == 30:
            second = lib.counter_install(-4)
    prof.step_end()
prof.close()
if HOW == "late_rt":
    say("first", lib.counter_calls(first))
    say("second", lib.counter_calls(second))
say("done", "yes")
