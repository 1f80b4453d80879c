"""Python-profiling windows: cProfile or pyinstrument, cut where the hook library says.

The library decides the windows (smdebug's sequence, docs/formats.md, "Window sequence") and names their
directories; this module runs the profilers. At each boundary it asks
``trainprof_python_boundary``: when a window ended, the running profiler is stopped, its
stats are written into ``ended_tmp_dir`` (outside the readers' view) and that directory is
sealed as ``ended_dir`` (synced, renamed without replacing anything: ``_seal``), so a reader
never sees half-written stats and a folder already there is kept; when a window starts,
a new profiler is started with the profiler and cProfile timer the library chose.

File contents are smdebug's (docs/formats.md, "File contents"): cProfile ``python_stats`` is
``pstats.Stats(profile).dump_stats``; pyinstrument writes ``python_stats.json``
(``JSONRenderer``) and ``python_stats.html``, or ``{"root_frame": null}`` and an error page
when pyinstrument fails.

Nothing here raises into the trainer: a problem is one message (pyinstrument missing: a
``TrainprofWarning``; the rest: the ``trainprof`` logger) and the window is skipped. In a ``fork()``ed child the inherited profiler is switched off and
nothing is ever written.
"""

from __future__ import annotations

import cProfile
import ctypes
import json
import os
import pstats
import shutil
import threading
import time
import weakref
from types import ModuleType
from typing import Any, Callable, Dict, List, Optional, Tuple, Union

from . import _caps, _fork, _lib
from ._log import log, warn_user
from ._seal import seal

CPROFILE_STATS_FILENAME = "python_stats"
PYINSTRUMENT_JSON_FILENAME = "python_stats.json"
PYINSTRUMENT_HTML_FILENAME = "python_stats.html"


# cProfile timers, as smdebug's smdebug/profiler/python_profile_utils.py defines them.
def total_time() -> float:
    """Wall-clock time (``os.times().elapsed``)."""
    return os.times().elapsed


def cpu_time() -> float:
    """CPU time of this process (user + system)."""
    t = os.times()
    return t.user + t.system


def off_cpu_time() -> float:
    """Wall-clock time not spent on a CPU (elapsed - (user + system))."""
    t = os.times()
    return t.elapsed - (t.user + t.system)


TIMERS: Dict[int, Callable[[], float]] = {
    _lib.CPROFILE_TIMER_NONE: total_time,
    _lib.CPROFILE_TIMER_TOTAL_TIME: total_time,
    _lib.CPROFILE_TIMER_CPU_TIME: cpu_time,
    _lib.CPROFILE_TIMER_OFF_CPU_TIME: off_cpu_time,
}


class _CProfileRun:
    """One cProfile window."""

    name = "cProfile"

    def __init__(self, timer: Callable[[], float]) -> None:
        self._profile = cProfile.Profile(timer)

    def start(self) -> None:
        self._profile.enable()

    def stop(self) -> None:
        self._profile.disable()

    def abandon(self) -> None:
        self._profile.disable()

    def dump(self, directory: str) -> None:
        pstats.Stats(self._profile).dump_stats(os.path.join(directory, CPROFILE_STATS_FILENAME))


class _PyinstrumentRun:
    """One pyinstrument window."""

    name = "pyinstrument"

    def __init__(self, module: ModuleType) -> None:
        self._renderers: Any = getattr(module, "renderers")
        self._profiler: Any = getattr(module, "Profiler")()
        self._failed: Optional[Exception] = None

    def start(self) -> None:
        self._profiler.start()

    def stop(self) -> None:
        try:
            self._profiler.stop()
        except Exception as e:  # pyinstrument's sporadic internal errors: smdebug's fallback files
            self._failed = e

    def abandon(self) -> None:
        self.stop()

    def samples(self) -> int:
        """The samples the stopped window took (0 when pyinstrument does not say)."""
        try:
            return int(getattr(self._profiler.last_session, "sample_count", 0) or 0)
        except Exception:
            return 0

    def _render(self, session: Any) -> Tuple[str, str]:
        return (
            self._renderers.JSONRenderer().render(session),
            self._renderers.HTMLRenderer().render(session),  # what Profiler.output_html() does
        )

    def dump(self, directory: str) -> None:
        try:
            if self._failed is not None:
                raise self._failed
            session = self._profiler.last_session
            try:
                json_stats, html = self._render(session)
            except AssertionError:
                # pyinstrument 3 asserts when the samples have two outermost frames: a
                # window that runs from the main module into the atexit handlers (the
                # post-close window). Keep the samples under the first outermost frame.
                records = getattr(session, "frame_records", None)
                if not records or not records[0][0]:
                    raise
                root = records[0][0][0]
                session.frame_records = [r for r in records if r[0] and r[0][0] == root]
                json_stats, html = self._render(session)
        except Exception as e:
            log(
                "pyinstrument failed (%s: %s); the window's stats are smdebug's error placeholder"
                % (type(e).__name__, e),
                key=("pyinstrument-failed", type(e).__name__),
            )
            json_stats = json.dumps({"root_frame": None})
            html = "An error occurred during profiling!"
        with open(os.path.join(directory, PYINSTRUMENT_JSON_FILENAME), "w") as f:
            f.write(json_stats)
        with open(os.path.join(directory, PYINSTRUMENT_HTML_FILENAME), "w") as f:
            f.write(html)


_Run = Union[_CProfileRun, _PyinstrumentRun]


def _import_pyinstrument() -> Optional[ModuleType]:
    """pyinstrument and its renderers, or None (one warning) when it is not installed."""
    try:
        import importlib

        importlib.import_module("pyinstrument.renderers")  # JSONRenderer, HTMLRenderer
        return importlib.import_module("pyinstrument")
    except Exception as e:
        warn_user(
            "pyinstrument cannot be imported (%s: %s); Python-profiling windows with ProfilerName "
            "Pyinstrument are skipped (pip install pyinstrument)" % (type(e).__name__, e),
            stacklevel=1,
            key="pyinstrument-missing",
        )
        return None


def _remove_empty_parents(path: str, stop: str) -> None:
    """Removes the empty directories above ``path`` up to, not including, ``stop``."""
    parent = os.path.dirname(path)
    while parent and parent != stop and parent.startswith(stop + os.sep):
        try:
            os.rmdir(parent)
        except OSError:
            return
        parent = os.path.dirname(parent)


_CLOSE = _lib.BOUNDARY_CLOSE
_EXIT = _lib.BOUNDARY_EXIT

# What trainprof_step_next answers when it did nothing at all (the hook not running, a
# wrong argument, a fork()ed child): the separate calls are made instead.
_STEP_NEXT_DID_NOTHING = frozenset(
    {
        _lib.STATUS_NOT_INITIALIZED,
        _lib.STATUS_SHUT_DOWN,
        _lib.STATUS_DISABLED,
        _lib.STATUS_FORKED_CHILD,
        _lib.STATUS_NULL_ARGUMENT,
        _lib.STATUS_INVALID_ARGUMENT,
    }
)


class Windows:
    """The process's Python-profiling state: the running window's profiler, if any.

    One per process and library (see :func:`windows_for`), because the library keeps one
    window sequence per process.
    """

    def __init__(self, lib: _lib.Library) -> None:
        self._lib = lib
        self._gen = _fork.generation()
        self._lock = threading.RLock()
        self._running: Optional[_Run] = None
        # The module once imported; False: it cannot be.
        self._pyinstrument: Union[ModuleType, None, bool] = None
        self.closed = False
        self.exited = False
        # One answer struct (8 KiB), reused under self._lock, and the export as a function
        # object without argtypes (the argument is a ready byref: _lib.raw_function), so a
        # boundary allocates nothing: three of them run every PyTorch step.
        self._answer = _lib.TrainprofPythonWindow()
        self._answer_ref = ctypes.byref(self._answer)
        # trainprof_step_next's other arguments and out-values, also used under self._lock.
        self._detailed_step = ctypes.c_int64(-1)
        self._step_out = ctypes.c_int64(-1)
        self._step_ref = ctypes.byref(self._step_out)
        self._windows_out = ctypes.c_int32(0)  # STEP_NEXT_* bits
        self._windows_ref = ctypes.byref(self._windows_out)
        self._c_boundary = _lib.raw_function(lib, "trainprof_python_boundary")
        # The windows' opens and closes (docs/formats.md, "The hook's own cost"): part ->
        # [calls, ns], and their ns summed (the step parts leave them out).
        self.cost: Dict[str, List[int]] = {"window.python.open": [0, 0], "window.python.close": [0, 0]}
        self.cost_ns: List[int] = [0]
        ref = weakref.ref(self)
        os.register_at_fork(after_in_child=lambda: _after_fork_in_child(ref))

    def boundary(self, boundary: int) -> None:
        """Applies one boundary (a ``BOUNDARY_*``). Never raises."""
        if _fork._generation != self._gen:
            return
        try:
            with self._lock:
                if self.exited or (self.closed and boundary != _EXIT):
                    return
                if boundary == _CLOSE:
                    self.closed = True
                elif boundary == _EXIT:
                    self.exited = True
                self._apply(boundary)
        except Exception as e:
            log("Python profiling: %s: %s (profiling goes on)" % (type(e).__name__, e))

    def close(self) -> None:
        """The hook closes: ends the running window, starts the post-close one (once)."""
        self.boundary(_lib.BOUNDARY_CLOSE)

    def exit(self) -> None:
        """Process exit: ends the post-close window (once, after :meth:`close`)."""
        if self.closed:
            self.boundary(_lib.BOUNDARY_EXIT)

    def step_next(self, fn: Callable[..., Any], mode: int, detailed_step: int) -> Optional[Tuple[int, int, int]]:
        """The step-start boundary as ``trainprof_step_next`` (``fn``, a function object
        without argtypes) makes it, together with the step end, the step begin of ``mode``
        (an int) and the detailed-window question at ``detailed_step`` (an int >= -1).
        The same state checks as :meth:`boundary`, under the same lock. Returns
        ``(status, step, windows)`` (``windows``: the ``STEP_NEXT_*`` bits), or None when the call was not made (closed, exited,
        another fork generation) or did nothing (the hook not running, a wrong argument):
        the caller then makes the separate calls. Never raises."""
        if _fork._generation != self._gen:
            return None
        try:
            with self._lock:
                if self.exited or self.closed:
                    return None
                self._detailed_step.value = detailed_step
                status: int = fn(mode, self._detailed_step, self._step_ref, self._answer_ref, self._windows_ref)
                answer = self._answer
                if status == 0 and not answer.ended and not answer.started:  # every step outside a window
                    return status, self._step_out.value, self._windows_out.value
                if status in _STEP_NEXT_DID_NOTHING:
                    return None
                if status == _lib.STATUS_INTERNAL:  # the out-values were not written
                    step, windows = -1, 0
                else:
                    step, windows = self._step_out.value, self._windows_out.value
                try:
                    self._answered(status, "trainprof_step_next")
                except Exception as e:
                    log("Python profiling: %s: %s (profiling goes on)" % (type(e).__name__, e))
                return status, step, windows
        except Exception as e:
            log("Python profiling: %s: %s (profiling goes on)" % (type(e).__name__, e))
            return None

    def _apply(self, boundary: int) -> None:
        status: int = self._c_boundary(boundary, self._answer_ref)
        if status == 0:
            answer = self._answer
            if not answer.ended and not answer.started:  # every boundary outside a window
                return
        self._answered(status, "trainprof_python_boundary")

    def _answered(self, status: int, what: str) -> None:
        """Ends and starts the profilers as the answer struct says, after ``what`` (the
        call that filled it) returned ``status``."""
        # The library writes the whole struct on every return but a panic (INTERNAL),
        # after which nothing of it is read.
        w = self._answer
        if status != _lib.STATUS_OK:
            if status < 0:
                # The library may have ended (and started) a window without telling which:
                # drop the running profiler rather than let it run into the next window.
                self._abandon()
                log(
                    "%s returned %s; Python profiling may miss windows" % (what, _lib.status_name(status)),
                    key=("boundary", status),
                )
                # `started` is filled in even when the ended window's path did not fit.
                if status == _lib.STATUS_BUFFER_TOO_SMALL and w.started:
                    self._start(w.profiler, w.timer)
            return
        if w.ended:
            t0 = time.perf_counter_ns()
            self._end(os.fsdecode(w.ended_dir), os.fsdecode(w.ended_tmp_dir))
            self._count("window.python.close", time.perf_counter_ns() - t0)
        if w.started:
            t0 = time.perf_counter_ns()
            self._start(w.profiler, w.timer)
            self._count("window.python.open", time.perf_counter_ns() - t0)

    def _count(self, part: str, ns: int) -> None:
        c = self.cost[part]
        c[0] += 1
        c[1] += ns
        self.cost_ns[0] += ns

    def _end(self, ended_dir: str, tmp_dir: str) -> None:
        run, self._running = self._running, None
        if run is None:  # the window had no profiler (pyinstrument missing, or start failed)
            return
        try:
            run.stop()
        except Exception as e:
            log(
                "cannot stop the %s profiler: %s: %s; window %s skipped" % (run.name, type(e).__name__, e, ended_dir),
                key=("stop", run.name),
            )
            return
        if isinstance(run, _PyinstrumentRun):
            self._check_cap(run)
        try:
            _makedirs(tmp_dir)
            run.dump(tmp_dir)
            os.makedirs(os.path.dirname(ended_dir), exist_ok=True)
            if not seal(tmp_dir, ended_dir):
                log(
                    "%s exists already; the %s window's stats are dropped (nothing is replaced)"
                    % (ended_dir, run.name),
                    key=("exists", run.name),
                )
                _rmtree_quietly(tmp_dir)
        except Exception as e:
            log(
                "cannot write %s stats to %s: %s: %s (training goes on)" % (run.name, ended_dir, type(e).__name__, e),
                key=("write", type(e).__name__),
            )
            _rmtree_quietly(tmp_dir)
        try:
            common = os.path.commonpath([ended_dir, tmp_dir])
            _remove_empty_parents(tmp_dir, common)
        except Exception:
            pass

    def _check_cap(self, run: _PyinstrumentRun) -> None:
        """pyinstrument keeps every sample: a window that took ``python_max_samples`` stops
        the Python window at its cap (docs/formats.md, "Window caps"), from the next
        boundary on. (cProfile keeps one entry per distinct function, bounded by the code.)"""
        try:
            limit = _caps.caps(self._lib)["python_max_samples"]
            samples = run.samples()
            if samples >= limit:
                _caps.capped(self._lib, _lib.FEATURE_PYTHON, "samples", samples, limit)
        except Exception as e:
            log("cannot check the Python window's cap: %s: %s" % (type(e).__name__, e), key="python-cap")

    def _start(self, profiler: int, timer: int) -> None:
        if self._running is not None:  # not expected: a start always follows an end
            self._abandon()
        run: _Run
        if profiler == _lib.PYTHON_PROFILER_CPROFILE:
            run = _CProfileRun(TIMERS.get(timer, total_time))
        elif profiler == _lib.PYTHON_PROFILER_PYINSTRUMENT:
            if self._pyinstrument is None:
                self._pyinstrument = _import_pyinstrument() or False
            if not isinstance(self._pyinstrument, ModuleType):
                return
            run = _PyinstrumentRun(self._pyinstrument)
        else:
            return
        try:
            run.start()
        except Exception as e:
            log(
                "cannot start the %s profiler (%s: %s); its windows are skipped" % (run.name, type(e).__name__, e),
                key=("start", run.name),
            )
            return
        self._running = run

    def _abandon(self) -> None:
        run, self._running = self._running, None
        if run is not None:
            try:
                run.abandon()
            except Exception:
                pass

    def in_forked_child(self) -> None:
        """Called in a fork()ed child: the inherited profiler stops, nothing is written."""
        self._lock = threading.RLock()  # another thread may have held it at fork time
        self._abandon()


def _makedirs(path: str) -> None:
    try:
        os.makedirs(path, exist_ok=True)
    except FileNotFoundError:  # a parent was removed by another process's clean-up meanwhile
        os.makedirs(path, exist_ok=True)


def _rmtree_quietly(path: str) -> None:
    shutil.rmtree(path, ignore_errors=True)


def _after_fork_in_child(ref: "weakref.ref[Windows]") -> None:
    w = ref()
    if w is not None:
        try:
            w.in_forked_child()
        except Exception:
            pass


_windows: Dict[int, Windows] = {}
_windows_lock = threading.Lock()


def windows_for(lib: _lib.Library) -> Windows:
    """The process's :class:`Windows` for ``lib``."""
    with _windows_lock:
        w = _windows.get(id(lib))
        if w is None:
            w = _windows[id(lib)] = Windows(lib)
        return w
