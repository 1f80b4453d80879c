"""trainprof.keras: profile ``model.fit`` / ``evaluate`` / ``predict`` with one callback.

::

    import trainprof.keras
    model.fit(x, y, callbacks=[trainprof.keras.ProfilerCallback()])

What :class:`ProfilerCallback` does, as smdebug 1.0.34's Keras hook does it (docs/formats.md, "Which step each framework tests"):

* ``on_{train,test,predict}_batch_begin`` begins a step of mode train / eval / predict, and
  ``on_*_batch_end`` ends it: one ``Step:ModeKeys.<MODE>`` event per batch, numbered per mode
  from 0 and counted across ``fit`` calls (smdebug's ``mode_steps``). The step-start and
  step-end Python-profiling boundaries come with them (:meth:`trainprof.Profiler.step_begin`).
* Detailed profiling: the TF profiler (the public ``tf.profiler.experimental.start`` /
  ``stop``) runs from the train-batch begin of the window's first step to the train-batch end
  of its last one (smdebug stops at the next train-batch begin, or at ``on_train_end``; so do
  we when the window was not over at a batch end). Its log dir (docs/formats.md, "TensorFlow
  detailed profiling") is ``<LocalPath>/framework/tensorflow/detailed_profiling/<local YYYYMMDDHH>/<train step, 9
  digits>/``, with the empty ``<node>_<start µs>_<stop µs>.metadata`` file smdebug's reader
  takes the trace's start time from. TF writes into a staging folder under
  ``<LocalPath>/.tmp/<node>/`` that is sealed into place once complete (synced, renamed
  without replacing anything: ``trainprof._seal``), so neither a reader nor the uploader sees
  half a profile, and a file already there is kept.
* TensorFlow 2.11 and later write only ``<host>.xplane.pb``; smdebug 1.0.34 reads only
  ``<host>.trace.json.gz``. The callback then converts the XSpace (its host planes: one
  process per plane, one thread per line) into ``<host>.trace.json.gz`` beside it, times
  relative to the metadata's start time. The ``.xplane.pb`` stays (TensorBoard reads it).

Importing this module imports neither tensorflow nor keras; the first use of
``ProfilerCallback`` does, and the class then subclasses ``tf.keras.callbacks.Callback``
(else ``keras.callbacks.Callback``, else ``object``, with one warning). Nothing here raises
into training: a missing piece (the hook library, the TF profiler, the XSpace protobuf
module) turns its feature off with one message (a ``TrainprofWarning`` for what the user can
install, else the ``trainprof`` logger), and training goes on.
"""

from __future__ import annotations

import atexit
import datetime
import gzip
import json
import os
import shutil
import weakref
from types import ModuleType
from typing import TYPE_CHECKING, Any, Callable, Dict, List, Optional, Tuple

if TYPE_CHECKING:
    from ._profiler import Profiler

from . import _caps
from ._log import log, warn_user
from ._seal import rename_no_replace, seal

__all__ = ["ProfilerCallback", "callback_class"]

#: Modes of smdebug's Keras hook, by Keras callback method prefix.
_MODES = {"train": "train", "test": "eval", "predict": "predict"}

#: Where the XSpace protobuf module lives, newest TensorFlow first.
_XPLANE_MODULES = (
    "tensorflow.tsl.profiler.protobuf.xplane_pb2",
    "tsl.profiler.protobuf.xplane_pb2",
    "tensorflow.core.profiler.protobuf.xplane_pb2",
)
XPLANE_SUFFIX = ".xplane.pb"
TRACE_SUFFIX = ".trace.json.gz"


# --- where the output goes -----------------------------------------------------------------


def detailed_log_dir(root: str, train_step: int, today: Optional[datetime.datetime] = None) -> str:
    """``<root>/framework/tensorflow/detailed_profiling/<YYYYMMDDHH, local time>/<train step
    zero-padded to 9>`` (docs/formats.md, "TensorFlow detailed profiling")."""
    hour = (today or datetime.datetime.today()).strftime("%Y%m%d%H")
    return os.path.join(root, "framework", "tensorflow", "detailed_profiling", hour, str(train_step).zfill(9))


def metadata_name(node_id: str, start_us: float, end_us: float) -> str:
    """``<node>_<round(start µs)>_<round(end µs)>.metadata`` (smdebug's reader splits it on ``_``)."""
    return "%s_%d_%d.metadata" % (node_id, int(round(start_us)), int(round(end_us)))


# --- XSpace -> trace.json.gz -----------------------------------------------------------------


def _xplane_module() -> Optional[ModuleType]:
    import importlib

    for name in _XPLANE_MODULES:
        try:
            return importlib.import_module(name)
        except Exception:
            continue
    return None


def _stat_value(stat: Any) -> Any:
    which = stat.WhichOneof("value")
    return None if which is None else getattr(stat, which)


def profile_start_ns(space: Any) -> Optional[int]:
    """The session's start (ns since the epoch) from the ``Task Environment`` plane's
    ``profile_start_time`` stat, or None when the XSpace does not say."""
    for plane in space.planes:
        for stat in plane.stats:
            md = plane.stat_metadata.get(stat.metadata_id) if hasattr(plane.stat_metadata, "get") else None
            if md is not None and md.name == "profile_start_time":
                v = _stat_value(stat)
                if isinstance(v, int) and v > 0:
                    return v
    return None


def xspace_trace_events(space: Any) -> List[Dict[str, Any]]:
    """Chrome trace events of an XSpace: for each plane with events a ``process_name``, for
    each of its lines a ``thread_name``, and one complete (``X``) event per XEvent, ``ts`` in
    µs from the start of the profiling session (TF's timestamps are relative to it). Process
    ids start at 1: smdebug's reader gives pid 0 to its own start-time record."""
    out: List[Dict[str, Any]] = []
    pid = 0
    for plane in space.planes:
        lines = [line for line in plane.lines if len(line.events)]
        if not lines:
            continue
        pid += 1
        out.append({"name": "process_name", "ph": "M", "pid": pid, "args": {"name": plane.name}})
        names: Dict[int, str] = {}
        for line in lines:
            tid = line.display_id or line.id
            out.append(
                {
                    "name": "thread_name",
                    "ph": "M",
                    "pid": pid,
                    "tid": tid,
                    "args": {"name": line.display_name or line.name},
                }
            )
            base_ps = line.timestamp_ns * 1000
            for ev in line.events:
                name = names.get(ev.metadata_id)
                if name is None:
                    md = plane.event_metadata.get(ev.metadata_id)
                    name = (md.display_name or md.name) if md is not None else str(ev.metadata_id)
                    names[ev.metadata_id] = name
                out.append(
                    {
                        "name": name,
                        "ph": "X",
                        "pid": pid,
                        "tid": tid,
                        "ts": (base_ps + ev.offset_ps) / 1e6,
                        "dur": ev.duration_ps / 1e6,
                    }
                )
    return out


def convert_xplanes(log_dir: str, xplane: Any = None) -> Tuple[List[str], Optional[int]]:
    """Writes ``<host>.trace.json.gz`` beside each ``<host>.xplane.pb`` under ``log_dir``
    that has none. Returns (trace files written, the earliest session start in ns or None).
    Raises ImportError when no XSpace protobuf module can be imported."""
    pbs: List[str] = []
    for d, _, files in os.walk(log_dir):
        pbs.extend(os.path.join(d, f) for f in files if f.endswith(XPLANE_SUFFIX))
    pending = [p for p in sorted(pbs) if not os.path.exists(p[: -len(XPLANE_SUFFIX)] + TRACE_SUFFIX)]
    if not pending:
        return [], None
    xplane = xplane or _xplane_module()
    if xplane is None:
        raise ImportError("no XSpace protobuf module (tried %s)" % ", ".join(_XPLANE_MODULES))
    written: List[str] = []
    start_ns: Optional[int] = None
    for pb in pending:
        space = xplane.XSpace()
        with open(pb, "rb") as f:
            space.ParseFromString(f.read())
        s = profile_start_ns(space)
        if s is not None:
            start_ns = s if start_ns is None else min(start_ns, s)
        doc = {"displayTimeUnit": "ns", "traceEvents": xspace_trace_events(space)}
        target = pb[: -len(XPLANE_SUFFIX)] + TRACE_SUFFIX
        part = target + ".part"
        with gzip.open(part, "wb") as gz:
            gz.write(json.dumps(doc).encode("utf-8"))
        if seal(part, target):
            written.append(target)
        else:  # written meanwhile by someone else: theirs stays
            os.unlink(part)
    return written, start_ns


# --- moving a finished profile into place ----------------------------------------------------


def _publish(staging: str, final: str) -> None:
    """Seals ``staging`` as ``final``: one rename when ``final`` does not exist, else file by
    file (the ``.metadata`` file first, so no trace file is visible without it). Nothing is
    replaced: a file whose name is taken in ``final`` is dropped, with one message."""
    parent = os.path.dirname(final)
    os.makedirs(parent, exist_ok=True)
    if seal(staging, final):
        return
    moves: List[Tuple[bool, str, str]] = []
    for d, _, files in os.walk(staging):
        for f in files:
            src = os.path.join(d, f)
            moves.append((not f.endswith(".metadata"), src, os.path.join(final, os.path.relpath(src, staging))))
    for _, src, dst in sorted(moves):
        os.makedirs(os.path.dirname(dst), exist_ok=True)
        if not rename_no_replace(src, dst):  # synced by seal() above
            log("%s exists already; the new one is dropped (nothing is replaced)" % dst, key=("keras-exists", dst))
    shutil.rmtree(staging, ignore_errors=True)


class _Detailed:
    """The TF profiler over one detailed window at a time."""

    def __init__(self, root: str, node_id: str, now_us: Callable[[], int]) -> None:
        self._root = root
        self._node = node_id
        self._now_us = now_us
        self._tf_profiler: Any = None  # tf.profiler.experimental, once imported
        self.off = False  # the feature is off in this process (something is missing)
        self.running = False
        self.failed_window = False  # start failed: not again until the window closes
        self._staging = ""
        self._final = ""
        self._start_us: float = 0
        self.last_stop_us: Optional[int] = None  # how long the last stop took (TF's stop, conversion, move)
        self.rss0 = 0  # the trainer's resident memory when the running window opened

    def _api(self) -> Any:
        if self._tf_profiler is None:
            try:
                import tensorflow as tf

                api = tf.profiler.experimental
                api.start, api.stop  # noqa: B018 - both must exist
            except Exception as e:
                self.off = True
                warn_user(
                    "the TF profiler (tf.profiler.experimental.start / stop) is not available "
                    "(%s: %s); detailed profiling is off" % (type(e).__name__, e),
                    key="keras-tf-profiler-missing",
                )
                return None
            self._tf_profiler = api
        return self._tf_profiler

    def start(self, train_step: int) -> None:
        if self.off or self.running or self.failed_window:
            return
        api = self._api()
        if api is None:
            return
        try:
            self._final = detailed_log_dir(self._root, train_step)
            self._staging = os.path.join(self._root, ".tmp", self._node, "tf-detailed-%09d" % train_step)
            shutil.rmtree(self._staging, ignore_errors=True)  # a dead process's leftover
            os.makedirs(self._staging)
            # Taken before start(): TF counts trace times from its session's start, a little
            # later, so an event can look earlier than it was by at most start()'s own
            # duration and never later (it stays inside its step). smdebug takes it after;
            # TF >= 2.11's XSpace names the exact session start, which replaces this one.
            self._start_us = self._now_us()
            self.rss0 = _caps.rss_bytes()
            api.start(self._staging)
        except Exception as e:
            self.failed_window = True
            log(
                "cannot start the TF profiler for the detailed window at train step %d (%s: %s); "
                "that window is skipped" % (train_step, type(e).__name__, e),
                key="keras-tf-profiler-start",
            )
            if self._staging:
                shutil.rmtree(self._staging, ignore_errors=True)
            return
        self.running = True

    def stop(self) -> None:
        if not self.running:
            return
        self.running = False
        t0 = self._now_us()
        try:
            self._tf_profiler.stop()
        except Exception as e:
            log(
                "the TF profiler did not stop cleanly (%s: %s); this window's profile is dropped"
                % (type(e).__name__, e),
                key="keras-tf-profiler-stop",
            )
            shutil.rmtree(self._staging, ignore_errors=True)
            return
        end_us = self._now_us()
        try:
            start_us = self._start_us
            try:
                _, start_ns = convert_xplanes(self._staging)
                if start_ns is not None:
                    start_us = start_ns / 1000.0
            except ImportError as e:
                log(
                    "%s: TF's .xplane.pb profiles are kept but not converted to the trace.json.gz "
                    "files smdebug reads" % e,
                    key="keras-xplane-missing",
                )
            except Exception as e:
                log(
                    "cannot convert the TF profile to trace.json.gz (%s: %s)" % (type(e).__name__, e),
                    key="keras-xplane-convert",
                )
            meta = os.path.join(self._staging, metadata_name(self._node, start_us, end_us))
            # In the staging folder, the process's own: sealed with the folder just below.
            with open(meta, "xb"):
                pass
            _publish(self._staging, self._final)
            self.last_stop_us = self._now_us() - t0
        except Exception as e:
            log(
                "cannot write the detailed profile into %s (%s: %s)" % (self._final, type(e).__name__, e),
                key="keras-detailed-write",
            )


# --- the callback ---------------------------------------------------------------------------


class _ProfilerCallbackMixin:
    """The callback's behaviour; :func:`callback_class` puts it on a Keras ``Callback``."""

    def __init__(self, profiler: Optional[Profiler] = None, local_path: Optional[str] = None) -> None:
        """``profiler``: a :class:`trainprof.Profiler` to drive (default: a new one with
        ``framework="tensorflow"``, closed by :meth:`close`); ``local_path``: where the
        detailed profiles go (default: the hook's effective LocalPath,
        :attr:`trainprof.Profiler.local_path`)."""
        super().__init__()
        self._owns_profiler = profiler is None
        self._prof = profiler
        self._detailed: Optional[_Detailed] = None
        self._step: Dict[str, int] = {}  # mode -> the step begun last, while it is open
        self._train_step: Optional[int] = None
        if self._prof is None:
            try:
                from . import Profiler

                self._prof = Profiler(framework="tensorflow")
            except Exception as e:
                log(
                    "%s: %s; ProfilerCallback records nothing" % (type(e).__name__, e),
                    key="keras-no-profiler",
                )
                self._prof = None
        try:
            if self._prof is not None and self._prof.enabled:
                node = self._prof.node_id
                root = local_path or self._prof.local_path
                if node and root:
                    self._detailed = _Detailed(root, node, self._prof.now_us)
                elif node:
                    log(
                        "the hook library does not say its LocalPath; detailed profiling is off",
                        key="keras-no-local-path",
                    )
        except Exception as e:
            log("detailed profiling is off (%s: %s)" % (type(e).__name__, e), key="keras-detailed-init")
        ref = weakref.ref(self)
        atexit.register(_stop_at_exit, ref)

    @property
    def profiler(self) -> Optional[Profiler]:
        """The :class:`trainprof.Profiler` this callback drives (None when it could not be made)."""
        return self._prof

    @property
    def detailed_running(self) -> bool:
        """True while the TF profiler runs for a detailed window."""
        return self._detailed is not None and self._detailed.running

    # --- steps ----------------------------------------------------------------------------

    def _begin(self, kind: str) -> None:
        prof = self._prof
        if prof is None:
            return
        try:
            step = prof.step_begin(_MODES[kind])
            if step is None:  # a fork()ed child
                return
            self._step[kind] = step
            if kind == "train":
                self._train_step = step
                d = self._detailed
                if d is not None and not d.off:
                    if d.running:
                        self._check_cap(d, step)
                    if prof.active("detailed", step=step):
                        d.start(step)
                    else:
                        d.failed_window = False
                        d.stop()
        except Exception as e:
            log("on_%s_batch_begin: %s: %s" % (kind, type(e).__name__, e), key=("keras-begin", type(e)))

    def _check_cap(self, d: "_Detailed", step: int) -> None:
        """At a train step's start inside the detailed window: has the trainer's resident
        memory grown by ``detailed_max_bytes`` since the TF profiler started? Then the
        profiler is stopped (what it holds is written) and the library told, at this step,
        which then answers no for the rest of the window (docs/formats.md, "Window caps").
        The TF profiler keeps its events in its own buffers until it stops, out of the
        adapter's sight, so only the memory cap applies to it."""
        prof = self._prof
        if prof is None or not d.rss0:
            return
        limit = prof.window_caps()["detailed_max_bytes"]
        grown = _caps.rss_bytes() - d.rss0
        if grown >= limit:
            d.stop()
            prof.window_capped("detailed", "bytes", grown, limit, step=step)

    def _end(self, kind: str) -> None:
        prof = self._prof
        if prof is None:
            return
        try:
            step = self._step.pop(kind, None)
            if step is None:
                return
            prof.step_end()
            d = self._detailed
            if kind == "train" and d is not None and d.running and not prof.active("detailed", step=step + 1):
                d.stop()
        except Exception as e:
            log("on_%s_batch_end: %s: %s" % (kind, type(e).__name__, e), key=("keras-end", type(e)))

    def on_train_batch_begin(self, batch: int, logs: Optional[Dict[str, Any]] = None) -> None:
        self._begin("train")

    def on_train_batch_end(self, batch: int, logs: Optional[Dict[str, Any]] = None) -> None:
        self._end("train")

    def on_test_batch_begin(self, batch: int, logs: Optional[Dict[str, Any]] = None) -> None:
        self._begin("test")

    def on_test_batch_end(self, batch: int, logs: Optional[Dict[str, Any]] = None) -> None:
        self._end("test")

    def on_predict_batch_begin(self, batch: int, logs: Optional[Dict[str, Any]] = None) -> None:
        self._begin("predict")

    def on_predict_batch_end(self, batch: int, logs: Optional[Dict[str, Any]] = None) -> None:
        self._end("predict")

    def on_train_end(self, logs: Optional[Dict[str, Any]] = None) -> None:
        self._stop_detailed()

    def _stop_detailed(self) -> None:
        try:
            if self._detailed is not None:
                self._detailed.stop()
        except Exception as e:
            log("stopping the TF profiler: %s: %s" % (type(e).__name__, e), key="keras-stop")

    def close(self) -> None:
        """Stops a running TF profiler (its profile is written) and closes the profiler
        if this callback made it. Idempotent; also done at exit."""
        self._stop_detailed()
        if self._owns_profiler and self._prof is not None:
            try:
                self._prof.close()
            except Exception as e:
                log("close(): %s: %s" % (type(e).__name__, e), key="keras-close")


def _stop_at_exit(ref: "weakref.ref[_ProfilerCallbackMixin]") -> None:
    cb = ref()
    if cb is not None:
        cb._stop_detailed()


_classes: Dict[type, type] = {}


def callback_class(base: Optional[type] = None) -> type:
    """The callback class on ``base`` (default: ``tf.keras.callbacks.Callback``, else
    ``keras.callbacks.Callback``, else ``object``). One class per base."""
    if base is None:
        base = _default_base()
    cls = _classes.get(base)
    if cls is None:
        bases = (_ProfilerCallbackMixin,) if base is object else (_ProfilerCallbackMixin, base)
        cls = type("ProfilerCallback", bases, {"__module__": __name__, "__doc__": _ProfilerCallbackMixin.__doc__})
        _classes[base] = cls
    return cls


def _default_base() -> type:
    try:
        import tensorflow as tf

        tf_base: type = tf.keras.callbacks.Callback
        return tf_base
    except Exception as e:
        tf_error = e
    try:
        import keras

        keras_base: type = keras.callbacks.Callback
        return keras_base
    except Exception:
        pass
    warn_user(
        "neither tf.keras nor keras can be imported (%s: %s); ProfilerCallback is a plain "
        "object that Keras will not accept" % (type(tf_error).__name__, tf_error),
        key="keras-no-base",
    )
    return object


def __getattr__(name: str) -> type:
    # ``ProfilerCallback`` is made on first use, so importing this module imports no framework.
    if name == "ProfilerCallback":
        return callback_class()
    raise AttributeError("module %r has no attribute %r" % (__name__, name))
