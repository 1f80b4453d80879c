"""Python's part of the flight recorder (``HangDetectionConfig``; docs/formats.md, "Hang
and crash dumps"), installed once per process by the first live :class:`trainprof.Profiler`
when the library says the feature is on:

* every Python thread's stack at a dump: ``faulthandler.register`` on a real-time signal that
  nobody in the process uses (the library chooses it by the C-level disposition and the
  threads' masks, ``trainprof_hang_free_signal``), writing to an anonymous memfd whose
  descriptor the library keeps (``trainprof_hang_python``); a dump raises that signal on its
  own thread, so faulthandler's C handler writes the stacks without the GIL and without
  running any Python code, and copies them into the dump;
* a crash (SIGSEGV, SIGBUS, SIGABRT, SIGFPE): the library's handler (``trainprof_hang_arm_crash``)
  sits in front of the trainer's own dispositions and calls them as the kernel would have; the
  crash's Python stacks come through the same registration. ``faulthandler.enable`` is left
  to the trainer: enabled in front of a runtime's SIGSEGV handler it would hand that runtime a
  copy of the fault without its address (docs/trainer.md, "Signals");
* an uncaught exception: ``sys.excepthook`` and ``threading.excepthook`` are chained: the
  formatted traceback goes to ``trainprof_hang_exception``, then the previous hook runs as
  before (KeyboardInterrupt and SystemExit are left alone: a signal dump covers the first).

In a ``fork()``ed child (a DataLoader worker) what this module registered with faulthandler is
undone (the child's hook is inert, and the memfd is shared with the parent), so the child
behaves as without trainprof; the library's own handlers only chain there.

Nothing here raises into the trainer: a failure is one log line and that part is off.
"""

from __future__ import annotations

import faulthandler
import os
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
# Lines added at the end of an uncaught exception's dump (the OOM's memory snapshot).
_notes: List[str] = []


def add_exception_note(line: str) -> None:
    """A line the dump of an uncaught exception ends with (docs/formats.md, "Memory
    windows": the snapshot taken at the out-of-memory error)."""
    if len(_notes) < 8:
        _notes.append(line)


def _in_forked_child() -> None:
    try:
        if _registered_signal is not None:
            faulthandler.unregister(_registered_signal)
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
    for part in (_register_stacks, _arm_crash, _chain_excepthooks):
        try:
            part(lib)
        except Exception as e:  # never into the trainer
            log("hang detection: %s failed (%s: %s); that part is off" % (part.__name__, type(e).__name__, e))


def _register_stacks(lib: _lib.Library) -> None:
    global _registered_signal
    sig = int(lib.trainprof_hang_free_signal())
    if sig <= 0:
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


def _arm_crash(lib: _lib.Library) -> None:
    status = lib.trainprof_hang_arm_crash(1 if faulthandler.is_enabled() else 0)
    if status != _lib.STATUS_OK:
        log("hang detection: no crash dumps (trainprof_hang_arm_crash returned %s)" % _lib.status_name(status))


def _report(lib: _lib.Library, exc_type: Any, exc: Any, tb: Any) -> None:
    try:
        if exc_type is None or issubclass(exc_type, (KeyboardInterrupt, SystemExit)):
            return
        text = "".join(traceback.format_exception(exc_type, exc, tb))
        if _notes:
            text += "".join(n + "\n" for n in _notes)
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
