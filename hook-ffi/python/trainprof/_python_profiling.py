"""Python-profiling windows: cProfile or pyinstrument, cut where the hook library says.

The library decides the windows (smdebug's sequence, docs/formats.md, "Window sequence") and names their
directories; this module runs the profilers. At each boundary it asks
``trainprof_python_boundary``: when a window ended, the running profiler is stopped, its
stats are written into ``ended_tmp_dir`` (outside the readers' view) and that directory is
renamed to ``ended_dir``, so a reader never sees half-written stats; when a window starts,
a new profiler is started with the profiler and cProfile timer the library chose.

File contents are smdebug's (docs/formats.md, "File contents"): cProfile ``python_stats`` is
``pstats.Stats(profile).dump_stats``; pyinstrument writes ``python_stats.json``
(``JSONRenderer``) and ``python_stats.html``, or ``{"root_frame": null}`` and an error page
when pyinstrument fails.

Nothing here raises into the trainer: a problem is one ``trainprof: ...`` line on stderr and
the window is skipped. In a ``fork()``ed child the inherited profiler is switched off and
nothing is ever written.
"""

import cProfile
import ctypes
import json
import os
import pstats
import threading
import weakref

from . import _fork, _lib
from ._log import warn

CPROFILE_STATS_FILENAME = "python_stats"
PYINSTRUMENT_JSON_FILENAME = "python_stats.json"
PYINSTRUMENT_HTML_FILENAME = "python_stats.html"


# cProfile timers, as smdebug's smdebug/profiler/python_profile_utils.py defines them.
def total_time():
    """Wall-clock time (``os.times().elapsed``)."""
    return os.times().elapsed


def cpu_time():
    """CPU time of this process (user + system)."""
    t = os.times()
    return t.user + t.system


def off_cpu_time():
    """Wall-clock time not spent on a CPU (elapsed - (user + system))."""
    t = os.times()
    return t.elapsed - (t.user + t.system)


TIMERS = {
    _lib.CPROFILE_TIMER_NONE: total_time,
    _lib.CPROFILE_TIMER_TOTAL_TIME: total_time,
    _lib.CPROFILE_TIMER_CPU_TIME: cpu_time,
    _lib.CPROFILE_TIMER_OFF_CPU_TIME: off_cpu_time,
}


class _CProfileRun:
    """One cProfile window."""

    name = "cProfile"

    def __init__(self, timer):
        self._profile = cProfile.Profile(timer)

    def start(self):
        self._profile.enable()

    def stop(self):
        self._profile.disable()

    def abandon(self):
        self._profile.disable()

    def dump(self, directory):
        pstats.Stats(self._profile).dump_stats(os.path.join(directory, CPROFILE_STATS_FILENAME))


class _PyinstrumentRun:
    """One pyinstrument window."""

    name = "pyinstrument"

    def __init__(self, module):
        self._renderers = module.renderers
        self._profiler = module.Profiler()
        self._failed = False

    def start(self):
        self._profiler.start()

    def stop(self):
        try:
            self._profiler.stop()
        except Exception as e:  # pyinstrument's sporadic internal errors: smdebug's fallback files
            self._failed = e

    def abandon(self):
        self.stop()

    def _render(self, session):
        return (
            self._renderers.JSONRenderer().render(session),
            self._renderers.HTMLRenderer().render(session),  # what Profiler.output_html() does
        )

    def dump(self, directory):
        try:
            if self._failed:
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
            warn(
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


def _import_pyinstrument():
    """pyinstrument and its renderers, or None (one warning) when it is not installed."""
    try:
        import pyinstrument
        import pyinstrument.renderers  # noqa: F401  (JSONRenderer)

        return pyinstrument
    except Exception as e:
        warn(
            "pyinstrument cannot be imported (%s: %s); Python-profiling windows with ProfilerName "
            "Pyinstrument are skipped (pip install pyinstrument)" % (type(e).__name__, e),
            key="pyinstrument-missing",
        )
        return None


def _remove_empty_parents(path, stop):
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

    def __init__(self, lib):
        self._lib = lib
        self._gen = _fork.generation()
        self._lock = threading.RLock()
        self._running = None
        self._pyinstrument = None
        self.closed = False
        self.exited = False
        # One answer struct (8 KiB), reused under self._lock, and a function object of its
        # own without argtypes (the argument is a ready byref), so a boundary allocates
        # nothing: three of them run every PyTorch step.
        self._answer = _lib.TrainprofPythonWindow()
        self._answer_ref = ctypes.byref(self._answer)
        # trainprof_step_next's other arguments and out-values, also used under self._lock.
        self._detailed_step = ctypes.c_int64(-1)
        self._step_out = ctypes.c_int64(-1)
        self._step_ref = ctypes.byref(self._step_out)
        self._detailed_out = ctypes.c_int32(0)
        self._detailed_ref = ctypes.byref(self._detailed_out)
        self._c_boundary = None
        factory = getattr(lib, "_FuncPtr", None)
        if factory is not None:
            try:
                self._c_boundary = factory(("trainprof_python_boundary", lib))
                self._c_boundary.restype = ctypes.c_int32
            except Exception:
                self._c_boundary = None
        ref = weakref.ref(self)
        os.register_at_fork(after_in_child=lambda: _after_fork_in_child(ref))

    def _forked(self):
        return _fork.generation() != self._gen

    def boundary(self, boundary):
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
            warn("Python profiling: %s: %s (profiling goes on)" % (type(e).__name__, e))

    def close(self):
        """The hook closes: ends the running window, starts the post-close one (once)."""
        self.boundary(_lib.BOUNDARY_CLOSE)

    def exit(self):
        """Process exit: ends the post-close window (once, after :meth:`close`)."""
        if self.closed:
            self.boundary(_lib.BOUNDARY_EXIT)

    def step_next(self, fn, mode, detailed_step):
        """The step-start boundary as ``trainprof_step_next`` (``fn``, a function object
        without argtypes) makes it, together with the step end, the step begin of ``mode``
        (an int) and the detailed-window question at ``detailed_step`` (an int >= -1).
        The same state checks as :meth:`boundary`, under the same lock. Returns
        ``(status, step, detailed)``, or None when the call was not made (closed, exited,
        another fork generation) or did nothing (the hook not running, a wrong argument):
        the caller then makes the separate calls. Never raises."""
        if _fork._generation != self._gen:
            return None
        try:
            with self._lock:
                if self.exited or self.closed:
                    return None
                self._detailed_step.value = detailed_step
                status = fn(mode, self._detailed_step, self._step_ref, self._answer_ref, self._detailed_ref)
                answer = self._answer
                if status == 0 and not answer.ended and not answer.started:  # every step outside a window
                    return status, self._step_out.value, self._detailed_out.value
                if status in _STEP_NEXT_DID_NOTHING:
                    return None
                if status == _lib.STATUS_INTERNAL:  # the out-values were not written
                    step, detailed = -1, 0
                else:
                    step, detailed = self._step_out.value, self._detailed_out.value
                try:
                    self._answered(status, "trainprof_step_next")
                except Exception as e:
                    warn("Python profiling: %s: %s (profiling goes on)" % (type(e).__name__, e))
                return status, step, detailed
        except Exception as e:
            warn("Python profiling: %s: %s (profiling goes on)" % (type(e).__name__, e))
            return None

    def _apply(self, boundary):
        c_boundary = self._c_boundary
        if c_boundary is not None:
            status = c_boundary(boundary, self._answer_ref)
        else:
            status = self._lib.trainprof_python_boundary(boundary, self._answer_ref)
        if status == 0:
            answer = self._answer
            if not answer.ended and not answer.started:  # every boundary outside a window
                return
        self._answered(status, "trainprof_python_boundary")

    def _answered(self, status, what):
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
                warn(
                    "%s returned %s; Python profiling may miss windows" % (what, _lib.status_name(status)),
                    key=("boundary", status),
                )
                # `started` is filled in even when the ended window's path did not fit.
                if status == _lib.STATUS_BUFFER_TOO_SMALL and w.started:
                    self._start(w.profiler, w.timer)
            return
        if w.ended:
            self._end(os.fsdecode(w.ended_dir), os.fsdecode(w.ended_tmp_dir))
        if w.started:
            self._start(w.profiler, w.timer)

    def _end(self, ended_dir, tmp_dir):
        run, self._running = self._running, None
        if run is None:  # the window had no profiler (pyinstrument missing, or start failed)
            return
        try:
            run.stop()
        except Exception as e:
            warn(
                "cannot stop the %s profiler: %s: %s; window %s skipped" % (run.name, type(e).__name__, e, ended_dir),
                key=("stop", run.name),
            )
            return
        try:
            _makedirs(tmp_dir)
            run.dump(tmp_dir)
            os.makedirs(os.path.dirname(ended_dir), exist_ok=True)
            os.rename(tmp_dir, ended_dir)
        except Exception as e:
            warn(
                "cannot write %s stats to %s: %s: %s (training goes on)" % (run.name, ended_dir, type(e).__name__, e),
                key=("write", type(e).__name__),
            )
            _rmtree_quietly(tmp_dir)
        try:
            common = os.path.commonpath([ended_dir, tmp_dir])
            _remove_empty_parents(tmp_dir, common)
        except Exception:
            pass

    def _start(self, profiler, timer):
        if self._running is not None:  # not expected: a start always follows an end
            self._abandon()
        if profiler == _lib.PYTHON_PROFILER_CPROFILE:
            run = _CProfileRun(TIMERS.get(timer, total_time))
        elif profiler == _lib.PYTHON_PROFILER_PYINSTRUMENT:
            if self._pyinstrument is None:
                self._pyinstrument = _import_pyinstrument() or False
            if not self._pyinstrument:
                return
            run = _PyinstrumentRun(self._pyinstrument)
        else:
            return
        try:
            run.start()
        except Exception as e:
            warn(
                "cannot start the %s profiler (%s: %s); its windows are skipped" % (run.name, type(e).__name__, e),
                key=("start", run.name),
            )
            return
        self._running = run

    def _abandon(self):
        run, self._running = self._running, None
        if run is not None:
            try:
                run.abandon()
            except Exception:
                pass

    def in_forked_child(self):
        """Called in a fork()ed child: the inherited profiler stops, nothing is written."""
        self._lock = threading.RLock()  # another thread may have held it at fork time
        self._abandon()


def _makedirs(path):
    try:
        os.makedirs(path, exist_ok=True)
    except FileNotFoundError:  # a parent was removed by another process's clean-up meanwhile
        os.makedirs(path, exist_ok=True)


def _rmtree_quietly(path):
    import shutil

    shutil.rmtree(path, ignore_errors=True)


def _after_fork_in_child(ref):
    w = ref()
    if w is not None:
        try:
            w.in_forked_child()
        except Exception:
            pass


_windows = {}
_windows_lock = threading.Lock()


def windows_for(lib):
    """The process's :class:`Windows` for ``lib``."""
    with _windows_lock:
        w = _windows.get(id(lib))
        if w is None:
            w = _windows[id(lib)] = Windows(lib)
        return w
