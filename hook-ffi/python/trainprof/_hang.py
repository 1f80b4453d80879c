"""Python's part of the flight recorder (``HangDetectionConfig``; docs/formats.md, "Hang
and crash dumps"), installed once per process by the first live :class:`trainprof.Profiler`
when the library says the feature is on:

* every Python thread's stack at a dump: ``faulthandler.register`` on a free real-time
  signal, writing to an anonymous memfd whose descriptor the library keeps
  (``trainprof_hang_python``); the library's watchdog raises that signal on its own thread,
  so faulthandler's C handler writes the stacks without the GIL and without running any
  Python code, then copies them into the dump;
* a crash (SIGSEGV, SIGBUS, SIGABRT, SIGFPE): ``faulthandler.enable`` on a memfd the library
  made (``trainprof_hang_fatal_fd``), after the library installed its own handler, so
  faulthandler writes the Python stacks first and chains to the library's handler, which
  writes the dump (copying them in) and chains to what was there before. A trainer that enabled
  faulthandler itself keeps its own (no Python stacks in the crash dump then);
* an uncaught exception: ``sys.excepthook`` and ``threading.excepthook`` are chained: the
  formatted traceback goes to ``trainprof_hang_exception``, then the previous hook runs as
  before (KeyboardInterrupt and SystemExit are left alone: a signal dump covers the first).

In a ``fork()``ed child (a DataLoader worker) what this module registered with faulthandler is
undone (the child's hook is inert, and the memfds are shared with the parent), so the child
behaves as without trainprof; the library's own handlers only chain there.

Nothing here raises into the trainer: a failure is one log line and that part is off.
"""

from __future__ import annotations

import ctypes
import faulthandler
import os
import signal
import sys
import threading
import traceback
from typing import Any, List, Optional

from . import _lib
from ._log import log

_lock = threading.Lock()
_installed = False
# Kept open for the life of the process: faulthandler writes to them.
_keep: List[Any] = []
# What this module turned on in faulthandler, undone in a forked child.
_registered_signal: Optional[int] = None
_enabled_fatal = False


def _in_forked_child() -> None:
    try:
        if _registered_signal is not None:
            faulthandler.unregister(_registered_signal)
        if _enabled_fatal:
            faulthandler.disable()
    except Exception:
        pass


def install(lib: _lib.Library) -> None:
    """Installs the Python part once per process, when the library's feature is on."""
    global _installed
    with _lock:
        if _installed:
            return
        _installed = True
    try:
        if not (_lib.has(lib, "trainprof_hang_enabled") and lib.trainprof_hang_enabled() == 1):
            return
    except Exception:
        return
    os.register_at_fork(after_in_child=_in_forked_child)
    for part in (_register_stacks, _enable_fatal, _chain_excepthooks):
        try:
            part(lib)
        except Exception as e:  # never into the trainer
            log("hang detection: %s failed (%s: %s); that part is off" % (part.__name__, type(e).__name__, e))


def _free_signal() -> Optional[int]:
    """A real-time signal nobody handles (from ``SIGRTMIN + 4`` up; the library takes its
    own for native stacks from the top down)."""
    lo = getattr(signal, "SIGRTMIN", None)
    hi = getattr(signal, "SIGRTMAX", None)
    if lo is None or hi is None:
        return None
    for sig in range(int(lo) + 4, int(hi) - 4):
        try:
            if signal.getsignal(sig) == signal.SIG_DFL:
                return sig
        except (ValueError, OSError):
            continue
    return None


def _register_stacks(lib: _lib.Library) -> None:
    global _registered_signal
    sig = _free_signal()
    if sig is None:
        log("hang detection: no free real-time signal; dumps hold no Python stacks")
        return
    memfd = getattr(os, "memfd_create", None)
    if memfd is None:
        log("hang detection: no os.memfd_create; dumps hold no Python stacks")
        return
    # The library checks the name (/proc/self/fd) before it empties the file.
    fd = memfd("trainprof-python-stacks", getattr(os, "MFD_CLOEXEC", 1))
    faulthandler.register(sig, file=fd, all_threads=True, chain=False)
    _registered_signal = sig
    _keep.append(fd)
    status = lib.trainprof_hang_python(fd, sig)
    if status != _lib.STATUS_OK:
        faulthandler.unregister(sig)
        _registered_signal = None
        log("hang detection: trainprof_hang_python returned %s" % _lib.status_name(status))


def _enable_fatal(lib: _lib.Library) -> None:
    global _enabled_fatal
    if faulthandler.is_enabled():
        log("hang detection: faulthandler is already enabled by the trainer (kept); crash dumps hold no Python stacks")
    out = ctypes.c_int32(-1)
    status = lib.trainprof_hang_fatal_fd(ctypes.byref(out))
    if status != _lib.STATUS_OK:
        log("hang detection: no crash dumps (trainprof_hang_fatal_fd returned %s)" % _lib.status_name(status))
        return
    if not faulthandler.is_enabled():
        faulthandler.enable(file=out.value, all_threads=True)
        _enabled_fatal = True


def _report(lib: _lib.Library, exc_type: Any, exc: Any, tb: Any) -> None:
    try:
        if exc_type is None or issubclass(exc_type, (KeyboardInterrupt, SystemExit)):
            return
        text = "".join(traceback.format_exception(exc_type, exc, tb))
        lib.trainprof_hang_exception(text.encode("utf-8", "replace"))
    except Exception:
        pass


def _chain_excepthooks(lib: _lib.Library) -> None:
    previous = sys.excepthook

    def excepthook(exc_type: Any, exc: Any, tb: Any) -> None:
        _report(lib, exc_type, exc, tb)
        previous(exc_type, exc, tb)

    sys.excepthook = excepthook
    previous_threading = threading.excepthook

    def threading_excepthook(args: Any) -> None:
        _report(lib, args.exc_type, args.exc_value, args.exc_traceback)
        previous_threading(args)

    threading.excepthook = threading_excepthook
