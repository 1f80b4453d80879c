"""trainprof: profile a training loop into files that smdebug 1.0.34's readers read.

A thin layer over ``libtrainprof_hook.so`` (loaded with ctypes when a :class:`Profiler` is
made, from ``$TRAINPROF_HOOK_LIB`` or from this package's directory)::

    import trainprof
    prof = trainprof.Profiler(framework="pytorch")
    for batch in loader:
        prof.step_begin("train")
        with prof.record("Forward", "Net"):
            out = model(batch)
        prof.forward_end()
        prof.step_end()
    prof.close()

Importing this package imports neither torch nor tensorflow and does not load the library.
Profiling problems never raise into the training loop (one ``trainprof: ...`` line on
stderr instead): with ``TRAINPROF_DISABLE`` set, or without a loadable library, a
:class:`Profiler` does nothing (``Profiler(strict=True)`` raises :class:`LibraryError`
for the library instead). Wrong arguments (an unknown mode or feature name) raise
``ValueError``. In a ``fork()``ed child (a DataLoader worker) every method does nothing.
"""

import atexit
import ctypes
import numbers
import os
import struct
import threading
import time

_time_ns = time.time_ns
_c_int64 = ctypes.c_int64
_c_int32 = ctypes.c_int32
_c_uint32 = ctypes.c_uint32
_byref = ctypes.byref

from . import _fork, _lib
from ._lib import LibraryError
from ._log import warn

__version__ = "0.1.0"
__all__ = ["Profiler", "LibraryError", "FRAMEWORKS", "MODES", "FEATURES", "__version__"]

#: Frameworks the library names the Python-stats folder after.
FRAMEWORKS = ("pytorch", "tensorflow", "mxnet", "xgboost")
#: Mode names of :meth:`Profiler.step_begin` (smdebug's ``ModeKeys``).
MODES = {
    "train": _lib.MODE_TRAIN,
    "eval": _lib.MODE_EVAL,
    "predict": _lib.MODE_PREDICT,
    "global": _lib.MODE_GLOBAL,
}
#: Feature names of :meth:`Profiler.active`.
FEATURES = {
    "detailed": _lib.FEATURE_DETAILED,
    "dataloader": _lib.FEATURE_DATALOADER,
    "python": _lib.FEATURE_PYTHON,
    "smdataparallel": _lib.FEATURE_SMDATAPARALLEL,
    "native": _lib.FEATURE_NATIVE,
}

_I64_MIN = -(2**63)
_I64_MAX = 2**63 - 1
_STATS_FIELDS = tuple(name for name, _ in _lib.TrainprofStats._fields_)
# Read-only ctypes arguments shared by every call (never mutated, so safe across threads).
_C_STEP_CURRENT = _c_int64(-1)
_C_ZERO = _c_uint32(0)


def _fast_function(lib, name, restype):
    """A function object of its own for export ``name`` of ``lib`` (a ``ctypes.CDLL``),
    without ``argtypes``: the fast paths pass ctypes objects of the declared C types
    (``c_int64``, ``c_uint32``, ``byref``) or small Python ints for ``int32_t`` /
    ``uint32_t``, which skips the per-argument ``from_param`` conversion. The package's
    typed binding (``_lib``) stays what every other call goes through. None when ``lib``
    is not a CDLL (the :class:`_lib.NullLibrary`)."""
    factory = getattr(lib, "_FuncPtr", None)
    if factory is None:
        return None
    try:
        fn = factory((name, lib))
        fn.restype = restype
        return fn
    except Exception:
        return None


def _encode_name(what, name):
    if not isinstance(name, str):
        raise ValueError("%s must be a str, not %s" % (what, type(name).__name__))
    if "\0" in name:
        raise ValueError("%s must not contain NUL characters: %r" % (what, name))
    try:
        return name.encode("utf-8")
    except UnicodeEncodeError as e:
        raise ValueError("%s is not encodable as UTF-8: %r (%s)" % (what, name, e)) from None


def _int64(what, v):
    if isinstance(v, bool) or not isinstance(v, numbers.Integral):
        raise ValueError("%s must be an int, not %s" % (what, type(v).__name__))
    v = int(v)
    if not _I64_MIN <= v <= _I64_MAX:
        raise ValueError("%s is out of the int64 range: %d" % (what, v))
    return v


def _time_us(what, v):
    """An event time: an int, or a float truncated as smdebug truncates (``int(t * 1e6)``)."""
    if isinstance(v, numbers.Real) and not isinstance(v, (bool, numbers.Integral)):
        f = float(v)
        if f != f or f in (float("inf"), float("-inf")):
            raise ValueError("%s must be finite, not %r" % (what, v))
        v = int(f)
    return _int64(what, v)


def _step_arg(step):
    """``None`` or -1 -> -1 (the library's current / next step), else a non-negative int."""
    if step is None:
        return -1
    s = _int64("step", step)
    if s < -1:
        raise ValueError("step must be >= 0, or None / -1 for the default, not %d" % s)
    return s


def _arg_value(key, v):
    """(kind, int64 value) of one event argument."""
    if isinstance(v, bool) or type(v).__name__ == "bool_":  # bool, numpy.bool_
        return _lib.ARG_KIND_BOOL, 1 if v else 0
    if isinstance(v, numbers.Integral):
        return _lib.ARG_KIND_INT, _int64("args[%r]" % key, v)
    if isinstance(v, numbers.Real):
        bits = struct.unpack("<q", struct.pack("<d", float(v)))[0]
        return _lib.ARG_KIND_FLOAT, bits
    raise ValueError("args[%r] must be an int, float or bool, not %s" % (key, type(v).__name__))


class _NullSpan:
    """What :meth:`Profiler.record` returns when nothing is recorded."""

    __slots__ = ()

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        return False


_NULL_SPAN = _NullSpan()


class _Span:
    """``with prof.record(...)``: one complete event from ``__enter__`` to ``__exit__``."""

    __slots__ = ("_prof", "_phase", "_name", "_step", "_args", "_nargs", "_start")

    def __init__(self, prof, phase, name, step, args, nargs):
        self._prof = prof
        self._phase = phase
        self._name = name
        self._step = step
        self._args = args
        self._nargs = nargs
        self._start = None

    def __enter__(self):
        self._start = _time_ns() // 1000  # the library's clock (see _FastSpan)
        return self

    def __exit__(self, exc_type, exc, tb):
        prof = self._prof
        if self._start is not None and prof._gen == _fork.generation():
            end = _time_ns() // 1000
            prof._emit(self._phase, self._name, self._start, end, self._step, self._args, self._nargs)
        return False


class _FastSpan:
    """``with prof.record(phase, name)`` for names seen before, no args, the current step:
    the clock is Python's (``time.time_ns() // 1000`` is the library's: CLOCK_REALTIME,
    truncated to µs) and the one call is ``trainprof_record`` with ready-made arguments."""

    __slots__ = ("_prof", "_phase", "_name", "_start")

    def __init__(self, prof, phase, name):
        self._prof = prof
        self._phase = phase  # c_uint32
        self._name = name  # c_uint32
        self._start = 0

    def __enter__(self):
        self._start = _time_ns()
        return self

    def __exit__(self, exc_type, exc, tb):
        end = _time_ns() // 1000
        prof = self._prof
        if prof._gen == _fork._generation:
            status = prof._c_record(
                self._phase, self._name, _c_int64(self._start // 1000), _c_int64(end), _C_STEP_CURRENT, None, _C_ZERO
            )
            if status < 0:
                prof._record_failed(status)
        return False


class Profiler:
    """The hook for this process: steps, events, window questions, Python profiling.

    ``Profiler(framework)`` loads the library, calls ``trainprof_init(framework)`` (which
    reads ``SMPROFILER_CONFIG_PATH``) and opens the pre-step-zero Python-profiling window.
    When the config disables profiling, every method still works and does nothing.
    At exit the profiler is closed if it was not, and the post-close window ends.

    The kill switch: with ``TRAINPROF_DISABLE`` set (``1``, ``true``, ...) the library is
    not even loaded; when it cannot be loaded (not found, not a library, another ABI),
    one ``trainprof:`` line says why. Either way the profiler does nothing
    (``init_status`` is ``DISABLED``). ``strict=True`` raises :class:`LibraryError` (an
    ``ImportError``) for a library that cannot be loaded instead.
    """

    def __init__(self, framework="pytorch", lib_path=None, shutdown_timeout_ms=10000, strict=False):
        if framework not in FRAMEWORKS:
            raise ValueError("framework must be one of %s, not %r" % (", ".join(FRAMEWORKS), framework))
        self._pid = os.getpid()
        self._gen = _fork.generation()
        self._framework = framework
        self._shutdown_timeout_ms = _int64("shutdown_timeout_ms", shutdown_timeout_ms)
        if not 0 <= self._shutdown_timeout_ms <= 2**32 - 1:
            raise ValueError("shutdown_timeout_ms must fit in 32 bits unsigned")
        self._names = {}
        # name -> c_uint32 of its id, for the fast paths (filled with _names).
        self._cids = {}
        # The fast paths' function objects (see _fast_function); None: take the typed path.
        self._c_record = None
        # True while the fast paths may run: recording, not closed, functions bound.
        self._fast = False
        self._names_lock = threading.Lock()
        # The id the library gives every new name once its table is full (None until then).
        self._over_limit_id = None
        self._next_step = dict.fromkeys(MODES.values(), 0)
        self._closed = False
        self._exited = False
        self._library_missing = False
        self._lib = self._load(lib_path, strict)
        self.init_status = self._lib.trainprof_init(framework.encode("ascii"))
        self._live = self.init_status == _lib.STATUS_OK
        if self.init_status not in (_lib.STATUS_OK, _lib.STATUS_DISABLED):
            warn(
                "trainprof_init returned %s; profiling is off in this process" % _lib.status_name(self.init_status),
                key=("init", self.init_status),
            )
        self._windows = None
        self._c_step_next = None
        self._step_end_boundary = True
        if self._live:
            self._c_record = _fast_function(self._lib, "trainprof_record", _c_int32)
            self._c_step_begin = _fast_function(self._lib, "trainprof_step_begin", _c_int32)
            self._c_step_end = _fast_function(self._lib, "trainprof_step_end", _c_int32)
            self._c_window_active = _fast_function(self._lib, "trainprof_window_active", _c_int32)
            self._fast = None not in (self._c_record, self._c_step_begin, self._c_step_end, self._c_window_active)
            # None with a library older than the export: the separate calls are made.
            self._c_step_next = _fast_function(self._lib, "trainprof_step_next", _c_int32)
            # A PyTorch hook ignores the step-end Python-profiling boundary (the library
            # returns at once, changing nothing): no call needed.
            self._step_end_boundary = framework != "pytorch"
            from . import _python_profiling

            self._windows = _python_profiling.windows_for(self._lib)
            self._windows.boundary(_lib.BOUNDARY_START)
        atexit.register(self._at_exit)

    def _load(self, lib_path, strict):
        """The library, or a :class:`_lib.NullLibrary` that does nothing (one warning)."""
        off = _lib.disabled_by_env()
        if off is not None:
            warn(
                "profiling is off (TRAINPROF_DISABLE=%s); the trainprof calls do nothing" % off,
                key="disabled-by-env",
            )
            return _lib.NullLibrary()
        try:
            return _lib.load(lib_path)
        except Exception as e:  # LibraryError, or anything ctypes raised on the way
            if strict:
                raise
            message = str(e) if isinstance(e, LibraryError) else "%s: %s" % (type(e).__name__, e)
            if message.startswith("trainprof: "):
                message = message[len("trainprof: ") :]
            warn("%s; profiling is off in this process" % message, key="no-library")
            self._library_missing = True
            return _lib.NullLibrary()

    # --- state -------------------------------------------------------------------------

    def _forked(self):
        return _fork.generation() != self._gen

    @property
    def enabled(self):
        """True when this profiler records (initialised, enabled by the config, not closed)."""
        return self._live and not self._closed and not self._forked()

    @property
    def framework(self):
        return self._framework

    def __repr__(self):
        return "<trainprof.Profiler framework=%s status=%s%s>" % (
            self._framework,
            _lib.status_name(self.init_status),
            " closed" if self._closed else "",
        )

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        self.close()
        return False

    # --- names ---------------------------------------------------------------------------

    def _name_id(self, name):
        """The library's id of ``name`` (registered once), or None when not recording."""
        nid = self._names.get(name)
        if nid is not None:
            return nid
        if self._over_limit_id is not None:
            # The library's table is full and never shrinks: no new name can get an id, so
            # no call (and no lock) is needed to learn that again.
            return self._over_limit_id
        encoded = _encode_name("name", name)
        with self._names_lock:
            nid = self._names.get(name)
            if nid is not None:
                return nid
            out = ctypes.c_uint32()
            status = self._lib.trainprof_register_name(encoded, ctypes.byref(out))
            if status == _lib.STATUS_NAME_LIMIT:
                # Not cached, so that this cache stays as bounded as the library's table:
                # the library drops and counts every event that uses this id.
                self._over_limit_id = out.value
                warn(
                    "the name table is full (TRAINPROF_MAX_NAMES); events with new names are dropped and counted",
                    key="name-limit",
                )
                return out.value
            if status != _lib.STATUS_OK:
                if status < 0:
                    warn("trainprof_register_name(%r) returned %s" % (name, _lib.status_name(status)))
                return None
            self._cids[name] = _c_uint32(out.value)
            self._names[name] = out.value
            return out.value

    # --- steps and boundaries -------------------------------------------------------------

    def step_begin(self, mode="train", step=None):
        """Begins a step of ``mode`` (train | eval | predict | global), numbered ``step``
        or, by default, the next of that mode counted from 0. Returns the step number.

        Every call also advances the global step (every mode counted together, from 0;
        set to ``step`` when one is given), which a ``pytorch`` profiler tests the windows at and names the Python-profiling
        folders by, as smdebug's PyTorch hook does (README, "The trainer side")."""
        if self._fast and step is None and _fork._generation == self._gen and type(mode) is str:
            m = MODES.get(mode)
            if m is not None:
                out = _c_int64(-1)
                status = self._c_step_begin(m, _C_STEP_CURRENT, _byref(out))
                n = out.value
                if status != _lib.STATUS_OK or n < 0:
                    if status < 0:
                        warn("trainprof_step_begin returned %s" % _lib.status_name(status), key=("step_begin", status))
                    n = self._next_step[m]
                self._next_step[m] = n + 1
                self._windows.boundary(_lib.BOUNDARY_STEP_START)
                return n
        if self._forked():
            return None
        m = MODES.get(mode) if isinstance(mode, str) else None
        if m is None:
            raise ValueError("mode must be one of %s, not %r" % (", ".join(MODES), mode))
        s = _step_arg(step)
        n = s if s >= 0 else self._next_step[m]
        if self.enabled:
            out = ctypes.c_int64(-1)
            status = self._lib.trainprof_step_begin(m, s, ctypes.byref(out))
            if status == _lib.STATUS_OK and out.value >= 0:
                n = out.value
            elif status < 0:
                warn("trainprof_step_begin returned %s" % _lib.status_name(status), key=("step_begin", status))
            self._next_step[m] = n + 1
            self._windows.boundary(_lib.BOUNDARY_STEP_START)
        else:
            self._next_step[m] = n + 1
        return n

    def _step_next(self, mode, detailed_step):
        """For the PyTorch adapter, in one library call (``trainprof_step_next``):
        ``step_end()`` when a step is in progress, ``step_begin(mode)`` (with its step-start
        Python-profiling boundary, applied by the Python-profiling state as
        :meth:`step_begin` applies it) and ``active("detailed", step=detailed_step)``.
        Returns the detailed answer (True / False), or None when the one call cannot be
        made (a library without it, not recording, the Python-profiling state closed, ...):
        the caller then makes the separate calls. ``mode``: a key of :data:`MODES`;
        ``detailed_step``: an int >= -1."""
        fn = self._c_step_next
        if fn is None or not self._fast or _fork._generation != self._gen:
            return None
        m = MODES.get(mode)
        if m is None:
            return None
        r = self._windows.step_next(fn, m, detailed_step)
        if r is None:
            return None
        status, n, detailed = r
        if n < 0:
            n = self._next_step[m]
        self._next_step[m] = n + 1
        return detailed == 1

    def forward_end(self):
        """The end of the forward pass (PyTorch): a Python-profiling boundary."""
        if _fork._generation != self._gen or not self._live or self._closed:
            return None
        self._windows.boundary(_lib.BOUNDARY_FORWARD_PASS_END)
        return None

    def step_end(self):
        """Ends the current step (writes its ``Step:ModeKeys.<MODE>`` event), then the
        step-end Python-profiling boundary (which the library ignores for PyTorch)."""
        if _fork._generation != self._gen or not self._live or self._closed:
            return None
        status = self._lib.trainprof_step_end()
        if status:
            if status == _lib.STATUS_NO_STEP:
                warn("step_end() without step_begin(); ignored", key="no-step")
            elif status < 0:
                warn("trainprof_step_end returned %s" % _lib.status_name(status), key=("step_end", status))
        if self._step_end_boundary:
            self._windows.boundary(_lib.BOUNDARY_STEP_END)
        return None

    # --- events --------------------------------------------------------------------------

    def _prepare(self, phase, name, step, args):
        """(phase id, name id, step, args array, n) or None when nothing is recorded."""
        s = -1 if step is None else _step_arg(step)
        if args:
            if not hasattr(args, "items"):
                raise ValueError("args must be a dict of name -> int | float | bool")
            if len(args) > _lib.MAX_ARGS:
                raise ValueError("at most %d args per event, got %d" % (_lib.MAX_ARGS, len(args)))
            values = [(k, _arg_value(k, v)) for k, v in args.items()]
        else:
            values = ()
        names = self._names
        # Validate every name before registering any (cached names were validated before).
        for k in (phase, name) + tuple(k for k, _ in values):
            if type(k) is not str or k not in names:
                _encode_name("name", k)
        if not self.enabled:
            return None
        pid = names.get(phase)
        if pid is None:
            pid = self._name_id(phase)
        nid = names.get(name)
        if nid is None:
            nid = self._name_id(name)
        if pid is None or nid is None:
            return None
        arr = None
        if values:
            arr = (_lib.TrainprofArg * len(values))()
            for i, (k, (kind, value)) in enumerate(values):
                kid = names.get(k)
                if kid is None:
                    kid = self._name_id(k)
                    if kid is None:
                        return None
                a = arr[i]
                a.key = kid
                a.kind = kind
                a.value = value
        return pid, nid, s, arr, len(values)

    def _emit(self, phase_id, name_id, start_us, end_us, step, args, nargs):
        status = self._lib.trainprof_record(phase_id, name_id, start_us, end_us, step, args, nargs)
        if status < 0:
            self._record_failed(status)

    def _record_failed(self, status):
        warn("trainprof_record returned %s; event dropped" % _lib.status_name(status), key=("record", status))

    def record(self, phase, name, args=None, step=None):
        """A context manager that records one complete event ``name`` in training phase
        ``phase`` (the timeline's process name), from entering to leaving the block.

        ``args``: up to 4 ``{key: int | float | bool}`` written as ``args.<key>``;
        ``step``: the step number (default: the current step)."""
        if self._fast and args is None and step is None:
            # Names seen before (so validated before): only str keys are cached, and a
            # name that is not (or is unhashable) takes the path below.
            cids = self._cids
            try:
                cp = cids[phase]
                cn = cids[name]
            except Exception:
                cp = None
            if cp is not None and _fork._generation == self._gen:
                return _FastSpan(self, cp, cn)
        if self._forked():
            return _NULL_SPAN
        if args is None and step is None and self._live and not self._closed:
            # The common case: names seen before, nothing to validate again.
            names = self._names
            pid = names.get(phase) if type(phase) is str else None
            nid = names.get(name) if type(name) is str else None
            if pid is not None and nid is not None:
                return _Span(self, pid, nid, -1, None, 0)
        prepared = self._prepare(phase, name, step, args)
        if prepared is None:
            return _NULL_SPAN
        pid, nid, s, arr, n = prepared
        return _Span(self, pid, nid, s, arr, n)

    def record_event(self, phase, name, start_us, end_us, step=None, args=None):
        """Records one complete event with explicit times: µs since the epoch, as
        :meth:`now_us` gives them (floats are truncated)."""
        if (
            args is None
            and self._fast
            and type(start_us) is int
            and type(end_us) is int
            and type(phase) is str
            and type(name) is str
            and (step is None or type(step) is int)
        ):
            cids = self._cids
            cp = cids.get(phase)
            cn = cids.get(name)
            if (
                cp is not None
                and cn is not None
                and _fork._generation == self._gen
                and _I64_MIN <= start_us <= end_us <= _I64_MAX
                and (step is None or -1 <= step <= _I64_MAX)
            ):
                status = self._c_record(
                    cp,
                    cn,
                    _c_int64(start_us),
                    _c_int64(end_us),
                    _C_STEP_CURRENT if step is None else _c_int64(step),
                    None,
                    _C_ZERO,
                )
                if status < 0:
                    self._record_failed(status)
                return None
        if self._forked():
            return None
        start_us = _time_us("start_us", start_us)
        end_us = _time_us("end_us", end_us)
        if end_us < start_us:
            raise ValueError("end_us (%d) is before start_us (%d)" % (end_us, start_us))
        prepared = self._prepare(phase, name, step, args)
        if prepared is None:
            return None
        pid, nid, s, arr, n = prepared
        self._emit(pid, nid, start_us, end_us, s, arr, n)
        return None

    def now_us(self):
        """The hook's clock: µs since the epoch. The library's clock is CLOCK_REALTIME
        truncated to µs (``SystemTime::now()``), which is what ``time.time_ns() // 1000``
        reads, without a call into the library."""
        return _time_ns() // 1000

    # --- questions ------------------------------------------------------------------------

    def active(self, feature, metrics_name=None, step=None):
        """Is ``feature``'s window (detailed | dataloader | python | smdataparallel) open
        at ``step``? By default, the current step as smdebug counts it for the framework:
        the global step for ``pytorch``, the current mode's step otherwise. The dataloader
        feature needs the metrics name its ``MetricsRegex`` is matched against."""
        if (
            self._fast
            and metrics_name is None
            and type(feature) is str
            and (step is None or (type(step) is int and -1 <= step <= _I64_MAX))
            and _fork._generation == self._gen
        ):
            f = FEATURES.get(feature)
            if f is not None and f != _lib.FEATURE_DATALOADER:
                out = _c_int32(0)
                status = self._c_window_active(
                    f, _C_STEP_CURRENT if step is None else _c_int64(step), None, _byref(out)
                )
                if status < 0:
                    warn("trainprof_window_active returned %s" % _lib.status_name(status), key=("active", status))
                return status == _lib.STATUS_OK and out.value == 1
        if self._forked():
            return False
        f = FEATURES.get(feature) if isinstance(feature, str) else None
        if f is None:
            raise ValueError("feature must be one of %s, not %r" % (", ".join(FEATURES), feature))
        s = _step_arg(step)
        name = None
        if f == _lib.FEATURE_DATALOADER:
            if metrics_name is None:
                raise ValueError("active('dataloader', metrics_name) needs the metrics name")
            name = _encode_name("metrics_name", metrics_name)
        elif metrics_name is not None:
            name = _encode_name("metrics_name", metrics_name)
        if not self.enabled:
            return False
        out = ctypes.c_int32(0)
        status = self._lib.trainprof_window_active(f, s, name, ctypes.byref(out))
        if status < 0:
            warn("trainprof_window_active returned %s" % _lib.status_name(status), key=("active", status))
        return status == _lib.STATUS_OK and out.value == 1

    def stats(self):
        """The hook's counters as a dict (zeros when profiling is off); None in a forked child."""
        if self._forked():
            return None
        out = _lib.TrainprofStats()
        self._lib.trainprof_stats(ctypes.byref(out))
        stats = {f: int(getattr(out, f)) for f in _STATS_FIELDS}
        stats["dropped_names"] = int(self._lib.trainprof_dropped_names())
        return stats

    @property
    def dropped(self):
        """Events lost so far (queue full, the disk or the writer, a name over the name
        table's limit); 0 in a forked child."""
        if self._forked():
            return 0
        return int(self._lib.trainprof_dropped_events())

    @property
    def node_id(self):
        """The node id in file and folder names (``<rank>-<host>``), or None when off."""
        if self._forked():
            return None
        for cap in (256, _lib.PATH_MAX, 65536):
            buf = ctypes.create_string_buffer(cap)
            status = self._lib.trainprof_node_id(buf, cap)
            if status == _lib.STATUS_OK:
                return buf.value.decode("utf-8", "replace")
            if status != _lib.STATUS_BUFFER_TOO_SMALL:
                return None
        return None

    @property
    def local_path(self):
        """The hook's effective ``LocalPath`` (``TRAINPROF_LOCAL_PATH``, else the config's
        ``LocalPath``, as the library resolved it at init), or None when profiling is off,
        in a forked child, or with a library too old to say."""
        if self._forked() or not _lib.has(self._lib, "trainprof_local_path"):
            return None
        path = _lib.read_string(self._lib.trainprof_local_path)
        return None if path is None else os.fsdecode(path)

    # --- the end ----------------------------------------------------------------------------

    def close(self):
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
            status = self._lib.trainprof_shutdown(self._shutdown_timeout_ms)
            if status == _lib.STATUS_TIMEOUT:
                warn(
                    "the writer did not finish within %d ms; the last timeline file may be sealed late"
                    % self._shutdown_timeout_ms
                )
            elif status < 0:
                warn("trainprof_shutdown returned %s" % _lib.status_name(status))
        except Exception as e:
            warn("close(): %s: %s" % (type(e).__name__, e))
        return None

    def _at_exit(self):
        if self._forked():
            return
        try:
            self.close()
            if self._live and not self._exited:
                self._exited = True
                self._windows.exit()
        except Exception as e:
            warn("at exit: %s: %s" % (type(e).__name__, e))
