"""The :class:`Profiler`: the hook of one process, over ``libtrainprof_hook.so``."""

from __future__ import annotations

import atexit
import ctypes
import logging
import os
import threading
import time
from typing import TYPE_CHECKING, Any, Callable, Dict, List, Mapping, Optional, Tuple, Union

from . import _caps, _check, _fork, _lib
from ._check import I64_MAX, I64_MIN
from ._lib import LibraryError
from ._log import log, warn_user
from ._span import NULL_SPAN, Span

if TYPE_CHECKING:
    from ._python_profiling import Windows

__all__ = ["Profiler", "FRAMEWORKS", "MODES", "FEATURES", "ArgValue"]

_time_ns = time.time_ns
_perf_ns = time.perf_counter_ns
_c_int64 = ctypes.c_int64
_c_int32 = ctypes.c_int32
_c_uint32 = ctypes.c_uint32
_byref = ctypes.byref

#: Frameworks the library names the Python-stats folder after.
FRAMEWORKS = ("pytorch", "tensorflow", "mxnet", "xgboost")
#: Mode names of :meth:`Profiler.step_begin` (smdebug's ``ModeKeys``).
MODES: Mapping[str, int] = {
    "train": _lib.MODE_TRAIN,
    "eval": _lib.MODE_EVAL,
    "predict": _lib.MODE_PREDICT,
    "global": _lib.MODE_GLOBAL,
}
#: Feature names of :meth:`Profiler.active`.
FEATURES: Mapping[str, int] = {
    "detailed": _lib.FEATURE_DETAILED,
    "dataloader": _lib.FEATURE_DATALOADER,
    "python": _lib.FEATURE_PYTHON,
    "smdataparallel": _lib.FEATURE_SMDATAPARALLEL,
    "native": _lib.FEATURE_NATIVE,
    "memory": _lib.FEATURE_MEMORY,
}
# The features asked without a metrics name (all but the dataloader's).
_NAMELESS_FEATURES = {k: v for k, v in FEATURES.items() if v != _lib.FEATURE_DATALOADER}

#: The value of an event argument.
ArgValue = Union[int, float, bool]

#: The Python package's parts of the hook's cost record
#: (docs/formats.md, "The hook's own cost"): its entry points, timed around the whole call
#: (the C call they make included), and the windows' opens and closes, handed to the
#: library before it shuts down.
COST_PARTS = (
    "python.step",
    "python.record",
    "python.active",
    "window.detailed.open",
    "window.detailed.close",
    "window.python.open",
    "window.python.close",
)

_STATS_FIELDS = tuple(field[0] for field in _lib.TrainprofStats._fields_)
# Read-only ctypes arguments shared by every call (never mutated, so safe across threads).
_C_STEP_CURRENT = _c_int64(-1)
_C_ZERO = _c_uint32(0)

# trainprof_record's arguments after the times: step, args array, its length.
_Prepared = Tuple[
    ctypes.c_uint32, ctypes.c_uint32, ctypes.c_int64, "Optional[ctypes.Array[_lib.TrainprofArg]]", ctypes.c_uint32
]


class Profiler:
    """The hook for this process: steps, events, window questions, Python profiling.

    ``Profiler(framework)`` loads the library, calls ``trainprof_init(framework)`` (which
    reads ``SMPROFILER_CONFIG_PATH``) and opens the pre-step-zero Python-profiling window.
    When the config disables profiling, every method still works and does nothing.
    At exit the profiler is closed if it was not, and the post-close window ends.

    The kill switch: with ``TRAINPROF_DISABLE`` set (``1``, ``true``, ...) the library is
    not even loaded (one ``trainprof:`` log line says so); when it cannot be loaded (not
    found, not a library, another ABI), a :class:`trainprof.TrainprofWarning` says why.
    Either way the profiler does nothing (``init_status`` is ``DISABLED``).
    ``strict=True`` raises :class:`LibraryError` (an ``ImportError``) for a library that
    cannot be loaded instead.

    Hot paths: :meth:`record`, :meth:`record_event`, :meth:`step_begin` and :meth:`active`
    each test first whether their arguments need no checking (names seen before, the
    current step, plain ints), and then go straight to the library's call, which each
    export gets in one place (:meth:`_begin`, :meth:`_window_active`; ``trainprof_record``:
    :meth:`_emit` for explicit times, ``Span.__exit__`` for a timed block).
    """

    _windows: Windows

    def __init__(
        self,
        framework: str = "pytorch",
        lib_path: Optional[_lib.PathLike] = None,
        shutdown_timeout_ms: int = 10000,
        strict: bool = False,
    ) -> None:
        if framework not in FRAMEWORKS:
            raise ValueError("framework must be one of %s, not %r" % (", ".join(FRAMEWORKS), framework))
        self._pid = os.getpid()
        self._gen = _fork.generation()
        self._framework = framework
        self._shutdown_timeout_ms = _check.int64("shutdown_timeout_ms", shutdown_timeout_ms)
        if not 0 <= self._shutdown_timeout_ms <= 2**32 - 1:
            raise ValueError("shutdown_timeout_ms must fit in 32 bits unsigned")
        # name -> its id in the library (registered once), ready as trainprof_record's argument.
        self._names: Dict[str, ctypes.c_uint32] = {}
        self._names_lock = threading.Lock()
        # The id the library gives every new name once its table is full (None until then).
        self._over_limit_id: Optional[ctypes.c_uint32] = None
        # True while the hot paths may skip their checks: recording and not closed.
        self._fast = False
        self._next_step = dict.fromkeys(MODES.values(), 0)
        # The hook's cost (docs/formats.md, "The hook's own cost"): part -> [calls, ns];
        # the step parts leave out the Python-profiling windows' opens and closes made
        # inside them (the windows' own parts, the ns of which _win_ns sums).
        self._cost: Dict[str, List[int]] = {p: [0, 0] for p in COST_PARTS}
        self._cost_step = self._cost["python.step"]
        self._cost_record = self._cost["python.record"]
        self._cost_active = self._cost["python.active"]
        self._win_ns: List[int] = [0]
        self._closed = False
        self._exited = False
        self._library_missing = False
        self._lib = self._load(lib_path, strict)
        self._c_record = _lib.raw_function(self._lib, "trainprof_record")
        self._c_step_begin = _lib.raw_function(self._lib, "trainprof_step_begin")
        self._c_window_active = _lib.raw_function(self._lib, "trainprof_window_active")
        # None with a library older than the export: the separate calls are made.
        self._c_step_next: Optional[Callable[..., Any]] = None
        if _lib.has(self._lib, "trainprof_step_next"):
            self._c_step_next = _lib.raw_function(self._lib, "trainprof_step_next")
        self.init_status: int = self._lib.trainprof_init(framework.encode("ascii"))
        self._live = self.init_status == _lib.STATUS_OK
        if self.init_status not in (_lib.STATUS_OK, _lib.STATUS_DISABLED):
            log(
                "trainprof_init returned %s; profiling is off in this process" % _lib.status_name(self.init_status),
                key=("init", self.init_status),
            )
        # A PyTorch hook ignores the step-end Python-profiling boundary (the library
        # returns at once, changing nothing): no call needed.
        self._step_end_boundary = framework != "pytorch"
        if self._live:
            from ._python_profiling import windows_for

            self._windows = windows_for(self._lib)
            self._win_ns = self._windows.cost_ns
            self._windows.boundary(_lib.BOUNDARY_START)
            self._fast = True
            from . import _hang

            _hang.install(self._lib)
        atexit.register(self._at_exit)

    def _load(self, lib_path: Optional[_lib.PathLike], strict: bool) -> _lib.Library:
        """The library, or a :class:`_lib.NullLibrary` that does nothing (one message)."""
        off = _lib.disabled_by_env()
        if off is not None:
            log("profiling is off (TRAINPROF_DISABLE=%s); the trainprof calls do nothing" % off, key="disabled-by-env")
            return _lib.NullLibrary()
        try:
            return _lib.load(lib_path)
        except Exception as e:  # LibraryError, or anything ctypes raised on the way
            if strict:
                raise
            message = str(e) if isinstance(e, LibraryError) else "%s: %s" % (type(e).__name__, e)
            # Where the user made this profiler: past this method and __init__.
            warn_user("%s; profiling is off in this process" % message, stacklevel=3, key="no-library")
            self._library_missing = True
            return _lib.NullLibrary()

    # --- state -------------------------------------------------------------------------

    def _forked(self) -> bool:
        return _fork.generation() != self._gen

    @property
    def enabled(self) -> bool:
        """True when this profiler records (initialised, enabled by the config, not closed)."""
        return self._live and not self._closed and not self._forked()

    @property
    def framework(self) -> str:
        return self._framework

    def __repr__(self) -> str:
        return "<trainprof.Profiler framework=%s status=%s%s>" % (
            self._framework,
            _lib.status_name(self.init_status),
            " closed" if self._closed else "",
        )

    def __enter__(self) -> Profiler:
        return self

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        self.close()

    # --- names ---------------------------------------------------------------------------

    def _name_id(self, name: str) -> Optional[ctypes.c_uint32]:
        """The library's id of ``name`` (a checked str, registered once), or None when the
        library gives none."""
        nid = self._names.get(name)
        if nid is not None:
            return nid
        if self._over_limit_id is not None:
            # The library's table is full and never shrinks: no new name can get an id, so
            # no call (and no lock) is needed to learn that again.
            return self._over_limit_id
        encoded = name.encode("utf-8")
        with self._names_lock:
            nid = self._names.get(name)
            if nid is not None:
                return nid
            out = _c_uint32()
            status: int = self._lib.trainprof_register_name(encoded, _byref(out))
            if status == _lib.STATUS_NAME_LIMIT:
                # Not cached, so that this cache stays as bounded as the library's table:
                # the library drops and counts every event that uses this id.
                self._over_limit_id = out
                log(
                    "the name table is full (TRAINPROF_MAX_NAMES); events with new names are dropped and counted",
                    key="name-limit",
                )
                return out
            if status != _lib.STATUS_OK:
                if status < 0:
                    log("trainprof_register_name(%r) returned %s" % (name, _lib.status_name(status)))
                return None
            self._names[name] = out
            return out

    # --- steps and boundaries -------------------------------------------------------------

    def step_begin(self, mode: str = "train", step: Optional[int] = None) -> Optional[int]:
        """Begins a step of ``mode`` (train | eval | predict | global), numbered ``step``
        or, by default, the next of that mode counted from 0. Returns the step number
        (None in a ``fork()``ed child).

        Every call also advances the global step (every mode counted together, from 0;
        set to ``step`` when one is given), which a ``pytorch`` profiler tests the windows
        at and names the Python-profiling folders by, as smdebug's PyTorch hook does
        (docs/formats.md, "Which step each framework tests")."""
        t0 = _perf_ns()
        w0 = self._win_ns[0]
        try:
            return self._step_begin(mode, step)
        finally:
            c = self._cost_step
            c[0] += 1
            c[1] += _perf_ns() - t0 - (self._win_ns[0] - w0)

    def _step_begin(self, mode: str, step: Optional[int]) -> Optional[int]:
        if self._fast and step is None and type(mode) is str and _fork._generation == self._gen:
            m = MODES.get(mode)
            if m is not None:
                return self._begin(m, _C_STEP_CURRENT, -1)
        if self._forked():
            return None
        m = MODES.get(mode) if isinstance(mode, str) else None
        if m is None:
            raise ValueError("mode must be one of %s, not %r" % (", ".join(MODES), mode))
        s = _check.step(step)
        if not self.enabled:
            n = s if s >= 0 else self._next_step[m]
            self._next_step[m] = n + 1
            return n
        return self._begin(m, _c_int64(s), s)

    def _begin(self, mode: int, c_step: ctypes.c_int64, step: int) -> int:
        """The one call of ``trainprof_step_begin`` (``step``: -1 for the next one)."""
        out = _c_int64(-1)
        status: int = self._c_step_begin(mode, c_step, _byref(out))
        n = out.value
        if status != _lib.STATUS_OK or n < 0:
            if status < 0:
                log("trainprof_step_begin returned %s" % _lib.status_name(status), key=("step_begin", status))
            n = step if step >= 0 else self._next_step[mode]
        self._next_step[mode] = n + 1
        self._windows.boundary(_lib.BOUNDARY_STEP_START)
        return n

    def _step_next(self, mode: str, detailed_step: int) -> Optional[int]:
        """For the PyTorch adapter, in one library call (``trainprof_step_next``):
        ``step_end()`` when a step is in progress, ``step_begin(mode)`` (with its step-start
        Python-profiling boundary, applied by the Python-profiling state as
        :meth:`step_begin` applies it), ``active("detailed", step=detailed_step)`` and
        whether a triggered or requested memory window is open at that step (docs/formats.md,
        "Memory windows"). Returns the bits ``_lib.STEP_NEXT_DETAILED`` and
        ``_lib.STEP_NEXT_MEMORY`` (0 when neither), or None when the one call cannot be
        made (a library without it, not recording, the Python-profiling state closed, ...):
        the caller then makes the separate calls. ``mode``: a key of :data:`MODES`;
        ``detailed_step``: an int >= -1."""
        t0 = _perf_ns()
        w0 = self._win_ns[0]
        try:
            return self._step_next_call(mode, detailed_step)
        finally:
            c = self._cost_step
            c[0] += 1
            c[1] += _perf_ns() - t0 - (self._win_ns[0] - w0)

    def _step_next_call(self, mode: str, detailed_step: int) -> Optional[int]:
        fn = self._c_step_next
        if fn is None or not self._fast or _fork._generation != self._gen:
            return None
        m = MODES.get(mode)
        if m is None:
            return None
        r = self._windows.step_next(fn, m, detailed_step)
        if r is None:
            return None
        _status, n, windows = r
        if n < 0:
            n = self._next_step[m]
        self._next_step[m] = n + 1
        return int(windows)

    def forward_end(self) -> None:
        """The end of the forward pass (PyTorch): a Python-profiling boundary."""
        if _fork._generation != self._gen or not self._live or self._closed:
            return None
        self._windows.boundary(_lib.BOUNDARY_FORWARD_PASS_END)
        return None

    def step_end(self) -> None:
        """Ends the current step (writes its ``Step:ModeKeys.<MODE>`` event), then the
        step-end Python-profiling boundary (which the library ignores for PyTorch)."""
        t0 = _perf_ns()
        w0 = self._win_ns[0]
        try:
            return self._step_end()
        finally:
            c = self._cost_step
            c[0] += 1
            c[1] += _perf_ns() - t0 - (self._win_ns[0] - w0)

    def _step_end(self) -> None:
        if _fork._generation != self._gen or not self._live or self._closed:
            return None
        status: int = self._lib.trainprof_step_end()
        if status:
            if status == _lib.STATUS_NO_STEP:
                # stacklevel 3: the caller of step_end, above its timing frame.
                warn_user("step_end() without step_begin(); ignored", stacklevel=3, key="no-step")
            elif status < 0:
                log("trainprof_step_end returned %s" % _lib.status_name(status), key=("step_end", status))
        if self._step_end_boundary:
            self._windows.boundary(_lib.BOUNDARY_STEP_END)
        return None

    # --- events --------------------------------------------------------------------------

    def _prepare(
        self, phase: object, name: object, step: Optional[int], args: Optional[Mapping[str, ArgValue]]
    ) -> Optional[_Prepared]:
        """``trainprof_record``'s arguments but the times, checked, or None when nothing
        is recorded."""
        s = -1 if step is None else _check.step(step)
        values: Tuple[Tuple[str, Tuple[int, int]], ...] = ()
        if args:
            if not hasattr(args, "items"):
                raise ValueError("args must be a dict of name -> int | float | bool")
            if len(args) > _lib.MAX_ARGS:
                raise ValueError("at most %d args per event, got %d" % (_lib.MAX_ARGS, len(args)))
            values = tuple((k, _check.arg_value(k, v)) for k, v in args.items())
        names = self._names
        # Check every name before registering any (cached names were checked before).
        keys = (phase, name) + tuple(k for k, _ in values)
        for k in keys:
            if type(k) is not str or k not in names:
                _check.encode_name("name", k)
        if not self.enabled:
            return None
        ids = []
        for k in keys:
            nid = self._name_id(k)  # type: ignore[arg-type]  # checked above: a str
            if nid is None:
                return None
            ids.append(nid)
        arr = None
        if values:
            arr = (_lib.TrainprofArg * len(values))()
            for a, nid, (_, (kind, value)) in zip(arr, ids[2:], values):
                a.key = nid.value
                a.kind = kind
                a.value = value
        return ids[0], ids[1], _c_int64(s), arr, _c_uint32(len(values))

    def _emit(
        self,
        phase: ctypes.c_uint32,
        name: ctypes.c_uint32,
        start_us: int,
        end_us: int,
        step: ctypes.c_int64,
        args: Optional[ctypes.Array[_lib.TrainprofArg]],
        nargs: ctypes.c_uint32,
    ) -> None:
        """``trainprof_record`` of an event with explicit times (``start_us`` <= ``end_us``,
        both int64); a span makes the same call in ``Span.__exit__``."""
        status: int = self._c_record(phase, name, _c_int64(start_us), _c_int64(end_us), step, args, nargs)
        if status < 0:
            self._record_failed(status)

    def _record_failed(self, status: int) -> None:
        log("trainprof_record returned %s; event dropped" % _lib.status_name(status), key=("record", status))

    def _int_args(self, args: Mapping[str, ArgValue]) -> Optional[ctypes.Array[_lib.TrainprofArg]]:
        """``args`` as the library's array when every key is a name seen before and every
        value an int (not a bool) in the int64 range; else None (the checked path decides)."""
        names = self._names
        arr = (_lib.TrainprofArg * len(args))()
        for a, (k, v) in zip(arr, args.items()):
            if type(v) is not int or not I64_MIN <= v <= I64_MAX:
                return None
            nid = names.get(k) if type(k) is str else None
            if nid is None:
                return None
            a.key = nid.value
            a.kind = _lib.ARG_KIND_INT
            a.value = v
        return arr

    def record(
        self, phase: str, name: str, args: Optional[Mapping[str, ArgValue]] = None, step: Optional[int] = None
    ) -> Span:
        """One complete event ``name`` in training phase ``phase`` (the timeline's process
        name): as a context manager, from entering to leaving the block; as a decorator,
        each call of the function::

            with prof.record("Forward", "Net"):
                out = model(batch)

            @prof.record("DataLoader", "decode")
            def decode(raw): ...

        ``args``: up to 4 ``{key: int | float | bool}`` written as ``args.<key>``;
        ``step``: the step number (default: the current step, when the event ends)."""
        if self._fast and args is None and step is None and _fork._generation == self._gen:
            names = self._names
            try:
                return Span(self, names[phase], names[name], _C_STEP_CURRENT, None, _C_ZERO)
            except (KeyError, TypeError):  # a name not seen before: checked below
                pass
        if self._forked():
            return NULL_SPAN
        prepared = self._prepare(phase, name, step, args)
        if prepared is None:
            return NULL_SPAN
        return Span(self, *prepared)

    def record_event(
        self,
        phase: str,
        name: str,
        start_us: Union[int, float],
        end_us: Union[int, float],
        step: Optional[int] = None,
        args: Optional[Mapping[str, ArgValue]] = None,
    ) -> None:
        """Records one complete event with explicit times: µs since the epoch, as
        :meth:`now_us` gives them (floats are truncated)."""
        t0 = _perf_ns()
        try:
            self._record_event(phase, name, start_us, end_us, step, args)
        finally:
            c = self._cost_record
            c[0] += 1
            c[1] += _perf_ns() - t0

    def _record_event(
        self,
        phase: str,
        name: str,
        start_us: Union[int, float],
        end_us: Union[int, float],
        step: Optional[int],
        args: Optional[Mapping[str, ArgValue]],
    ) -> None:
        if (
            self._fast
            and args is None
            and type(start_us) is int
            and type(end_us) is int
            and (step is None or (type(step) is int and -1 <= step <= I64_MAX))
            and I64_MIN <= start_us <= end_us <= I64_MAX
            and _fork._generation == self._gen
        ):
            names = self._names
            try:
                phase_id, name_id = names[phase], names[name]
            except (KeyError, TypeError):  # a name not seen before: checked below
                pass
            else:
                self._emit(
                    phase_id,
                    name_id,
                    start_us,
                    end_us,
                    _C_STEP_CURRENT if step is None else _c_int64(step),
                    None,
                    _C_ZERO,
                )
                return None
        elif (
            # The adapters' bulk path (a detailed window's thousands of op events): int
            # args under names seen before skip the generic checks, as above.
            self._fast
            and type(args) is dict
            and 0 < len(args) <= _lib.MAX_ARGS
            and type(start_us) is int
            and type(end_us) is int
            and type(step) is int
            and -1 <= step <= I64_MAX
            and I64_MIN <= start_us <= end_us <= I64_MAX
            and _fork._generation == self._gen
        ):
            arr = self._int_args(args)
            if arr is not None:
                names = self._names
                try:
                    phase_id, name_id = names[phase], names[name]
                except (KeyError, TypeError):
                    pass
                else:
                    self._emit(phase_id, name_id, start_us, end_us, _c_int64(step), arr, _c_uint32(len(args)))
                    return None
        if self._forked():
            return None
        start = _check.time_us("start_us", start_us)
        end = _check.time_us("end_us", end_us)
        if end < start:
            raise ValueError("end_us (%d) is before start_us (%d)" % (end, start))
        prepared = self._prepare(phase, name, step, args)
        if prepared is None:
            return None
        phase_id, name_id, c_step, arr, nargs = prepared
        self._emit(phase_id, name_id, start, end, c_step, arr, nargs)
        return None

    def now_us(self) -> int:
        """The hook's clock: µs since the epoch. The library's clock is CLOCK_REALTIME
        truncated to µs (``SystemTime::now()``), which is what ``time.time_ns() // 1000``
        reads, without a call into the library."""
        return _time_ns() // 1000

    # --- questions ------------------------------------------------------------------------

    def active(self, feature: str, metrics_name: Optional[str] = None, step: Optional[int] = None) -> bool:
        """Is ``feature``'s window (detailed | dataloader | python | smdataparallel |
        native | memory) open at ``step``? By default, the current step as smdebug counts it for the
        framework: the global step for ``pytorch``, the current mode's step otherwise. The
        dataloader feature needs the metrics name its ``MetricsRegex`` is matched against."""
        t0 = _perf_ns()
        try:
            return self._active(feature, metrics_name, step)
        finally:
            c = self._cost_active
            c[0] += 1
            c[1] += _perf_ns() - t0

    def _active(self, feature: str, metrics_name: Optional[str], step: Optional[int]) -> bool:
        if (
            self._fast
            and metrics_name is None
            and type(feature) is str
            and (step is None or (type(step) is int and -1 <= step <= I64_MAX))
            and _fork._generation == self._gen
        ):
            f = _NAMELESS_FEATURES.get(feature)
            if f is not None:
                return self._window_active(f, _C_STEP_CURRENT if step is None else _c_int64(step), None)
        if self._forked():
            return False
        fid = FEATURES.get(feature) if isinstance(feature, str) else None
        if fid is None:
            raise ValueError("feature must be one of %s, not %r" % (", ".join(FEATURES), feature))
        s = _check.step(step)
        name = None
        if fid == _lib.FEATURE_DATALOADER:
            if metrics_name is None:
                raise ValueError("active('dataloader', metrics_name) needs the metrics name")
            name = _check.encode_name("metrics_name", metrics_name)
        elif metrics_name is not None:
            name = _check.encode_name("metrics_name", metrics_name)
        if not self.enabled:
            return False
        return self._window_active(fid, _c_int64(s), name)

    def _window_active(self, feature: int, step: ctypes.c_int64, metrics_name: Optional[bytes]) -> bool:
        """The one call of ``trainprof_window_active``."""
        out = _c_int32(0)
        status: int = self._c_window_active(feature, step, metrics_name, _byref(out))
        if status < 0:
            log("trainprof_window_active returned %s" % _lib.status_name(status), key=("active", status))
        return status == _lib.STATUS_OK and out.value == 1

    def window_caps(self) -> Dict[str, int]:
        """The caps of every window (``WindowCapsConfig``, docs/formats.md, "Window caps"):
        ``detailed_max_events``, ``detailed_max_bytes``, ``dataloader_max_events``,
        ``python_max_samples``; the defaults when profiling is off."""
        if not self.enabled:
            return dict(_caps.DEFAULTS)
        return _caps.caps(self._lib)

    def window_capped(self, feature: str, cap: str, value: int, limit: int, step: Optional[int] = None) -> bool:
        """Stops ``feature``'s window (detailed | dataloader | python | native) at its cap
        ``cap`` (events | bytes | samples), having reached ``value`` of ``limit``, at
        ``step`` (default: the current one): the window answers no for the rest of its
        steps, and the library writes one ``trainprof:WindowCapped`` event and one log line.
        True when the library took it (False: capped already, or profiling is off)."""
        fid = FEATURES.get(feature)
        if fid is None or cap not in _caps.CAPS:
            raise ValueError("unknown feature %r or cap %r" % (feature, cap))
        if not self.enabled:
            return False
        return _caps.capped(self._lib, fid, cap, value, limit, step)

    # --- detailed windows through torch's own trace ------------------------------------------

    def _torch_trace_create(self) -> Optional[Tuple[int, str]]:
        """A new, empty file for torch.profiler's chrome trace, made by the library in its own
        folder (docs/formats.md, "Detailed windows through torch's own trace"): ``(token,
        path)``, or None (a library without it, not recording, or the file could not be made:
        the library said why)."""
        if not self.enabled or not _lib.has(self._lib, "trainprof_torch_trace_create"):
            return None
        buf = ctypes.create_string_buffer(_lib.PATH_MAX)
        token = ctypes.c_uint64(0)
        status: int = self._lib.trainprof_torch_trace_create(buf, _lib.PATH_MAX, _byref(token))
        if status != _lib.STATUS_OK:
            return None
        return int(token.value), os.fsdecode(buf.value)

    def _torch_trace_import(
        self, token: int, boundaries: "list[Tuple[int, int]]", events_before: int, max_events: int, notify_cap: bool
    ) -> bool:
        """Hands the trace ``token`` (torch wrote it) to the library's writer thread, which
        writes its ops as ``cpu_functions`` events, each numbered by the step of
        ``boundaries`` ((µs, global step) at each step begin, in order) it began in, up to
        the window's cap ``max_events`` (``events_before`` written already). True when the
        library took it."""
        n = len(boundaries)
        starts = (_c_int64 * max(n, 1))(*(int(t) for t, _ in boundaries))
        steps = (_c_int64 * max(n, 1))(*(int(s) for _, s in boundaries))
        status: int = self._lib.trainprof_torch_trace_import(
            token, starts, steps, n, max(0, int(events_before)), max(0, int(max_events)), 1 if notify_cap else 0
        )
        if status != _lib.STATUS_OK:
            log("trainprof_torch_trace_import returned %s" % _lib.status_name(status), key=("trace_import", status))
            return False
        return True

    def _torch_trace_discard(self, token: int) -> None:
        """Removes the trace ``token`` unread."""
        self._lib.trainprof_torch_trace_discard(token)

    # --- PyTorch memory snapshots ---------------------------------------------------------------

    def _memory_settings(self, defaults: bool = False) -> Optional[Dict[str, Any]]:
        """What ``MemoryProfilingConfig`` asks for (docs/formats.md, "Memory windows"):
        ``{"max_entries", "stacks" ("python" | "all"), "oom_snapshot"}``, or None when the
        feature is off (or the library is too old to say). ``defaults``: also when it is not
        configured (its defaults then), for a triggered window."""
        if not self.enabled or not _lib.has(self._lib, "trainprof_memory_settings"):
            return None
        out = _lib.TrainprofMemorySettings()
        status: int = self._lib.trainprof_memory_settings(_byref(out))
        if status != _lib.STATUS_OK or (out.enabled != 1 and not defaults):
            return None
        return {
            "max_entries": int(out.max_entries),
            "stacks": "all" if out.stacks == _lib.STACKS_ALL else "python",
            "oom_snapshot": out.oom_snapshot == 1,
        }

    def _memory_snapshot_create(self, oom: bool, first_step: int, last_step: int) -> Optional[Tuple[int, str]]:
        """A new, empty snapshot file made by the library (docs/formats.md, "Memory
        windows"): ``(fd, path)``, the descriptor open for writing and the caller's to close;
        None when it could not be made (the library said why)."""
        if not self.enabled or not _lib.has(self._lib, "trainprof_memory_snapshot_create"):
            return None
        buf = ctypes.create_string_buffer(_lib.PATH_MAX)
        fd = ctypes.c_int32(-1)
        kind = _lib.SNAPSHOT_KIND_OOM if oom else _lib.SNAPSHOT_KIND_WINDOW
        status: int = self._lib.trainprof_memory_snapshot_create(
            kind, _c_int64(first_step), _c_int64(last_step), buf, _lib.PATH_MAX, _byref(fd)
        )
        if status != _lib.STATUS_OK or fd.value < 0:
            return None
        return int(fd.value), os.fsdecode(buf.value)

    def stats(self) -> Optional[Dict[str, int]]:
        """The hook's counters as a dict (zeros when profiling is off); None in a forked child."""
        if self._forked():
            return None
        out = _lib.TrainprofStats()
        self._lib.trainprof_stats(_byref(out))
        stats = {f: int(getattr(out, f)) for f in _STATS_FIELDS}
        stats["dropped_names"] = int(self._lib.trainprof_dropped_names())
        return stats

    @property
    def dropped(self) -> int:
        """Events lost so far (queue full, the disk or the writer, a name over the name
        table's limit); 0 in a forked child."""
        if self._forked():
            return 0
        return int(self._lib.trainprof_dropped_events())

    @property
    def node_id(self) -> Optional[str]:
        """The node id in file and folder names (``<rank>-<host>``), or None when off."""
        if self._forked():
            return None
        node = _lib.read_string(self._lib.trainprof_node_id)
        return None if node is None else node.decode("utf-8", "replace")

    @property
    def local_path(self) -> Optional[str]:
        """The hook's effective ``LocalPath`` (``TRAINPROF_LOCAL_PATH``, else the config's
        ``LocalPath``, as the library resolved it at init), or None when profiling is off,
        in a forked child, or with a library too old to say."""
        if self._forked() or not _lib.has(self._lib, "trainprof_local_path"):
            return None
        path = _lib.read_string(self._lib.trainprof_local_path)
        return None if path is None else os.fsdecode(path)

    # --- the end ----------------------------------------------------------------------------

    def close(self) -> None:
        """Ends the running Python window (the post-close one starts and ends at exit),
        then drains the queue and seals the last timeline file. Idempotent."""
        if self._forked() or self._closed:
            return None
        self._closed = True
        self._fast = False
        if not self._live:
            return None
        try:
            self._windows.close()
            self._hand_over_cost()
            status: int = self._lib.trainprof_shutdown(self._shutdown_timeout_ms)
            if status == _lib.STATUS_TIMEOUT:
                log(
                    "the writer did not finish within %d ms; the last timeline file may be sealed late"
                    % self._shutdown_timeout_ms
                )
            elif status < 0:
                log("trainprof_shutdown returned %s" % _lib.status_name(status))
        except Exception as e:
            log("close(): %s: %s" % (type(e).__name__, e))
        return None

    def _add_cost(self, part: str, ns: int) -> None:
        """One call of ``part`` (a window's open or close, a word of :data:`COST_PARTS`)
        that took ``ns`` nanoseconds: for the adapters, which time the windows they run."""
        c = self._cost[part]
        c[0] += 1
        c[1] += ns

    def cost(self) -> Dict[str, Tuple[int, int]]:
        """The Python package's parts of the hook's cost so far: part -> (calls, ns)."""
        out = {p: (c[0], c[1]) for p, c in self._cost.items()}
        if self._live:
            for p, c in self._windows.cost.items():
                out[p] = (c[0], c[1])
        return out

    def _hand_over_cost(self) -> None:
        """Hands the Python parts to the library (``trainprof_cost_add``), which writes them
        into the hook's cost record at shutdown (docs/formats.md, "The hook's own cost")."""
        if not _lib.has(self._lib, "trainprof_cost_add"):
            return
        for part, (calls, ns) in self.cost().items():
            if calls > 0:
                status: int = self._lib.trainprof_cost_add(part.encode("ascii"), calls, max(ns, 0))
                if status < 0:
                    log("trainprof_cost_add returned %s" % _lib.status_name(status), key=("cost", status))

    def _at_exit(self) -> None:
        if self._forked():
            return
        try:
            self.close()
            if self._live and not self._exited:
                self._exited = True
                self._windows.exit()
        except Exception as e:
            log("at exit: %s: %s" % (type(e).__name__, e), level=logging.ERROR)
