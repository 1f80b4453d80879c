"""PyTorch memory snapshots (``MemoryProfilingConfig``; docs/formats.md, "Memory windows"):
the caching allocator's history recorded for a window's steps and dumped at its end, and
kept on (bounded) for one snapshot at a rank's first out-of-memory error.

The CUDA calls are behind :class:`CudaMemory` (the default), so a test double can stand in
where there is no GPU. :class:`Recorder` holds the state; ``trainprof.torch`` calls it at
each step begin and at close. A window ``trainprof trigger --memory`` or ``AutoProfilingConfig``
opens (docs/trigger.md) is recorded the same way: with ``MemoryProfilingConfig`` on, by the
recorder it made (the library's answer for the window covers both); without it, by a recorder
made at the first such window (:meth:`Recorder.for_trigger`), told at each step begin
whether that window is open (``trainprof_step_next``'s bit, no call of its own). The library makes each file (never over a file or through a
link, mode 0600); this module pickles the snapshot into it as
``torch.cuda.memory._dump_snapshot`` does. Nothing here raises into the trainer: a failure
is one log line and the feature is off.
"""

from __future__ import annotations

import os
import pickle
import sys
import threading
from typing import TYPE_CHECKING, Any, Callable, Dict, Optional

from . import _hang
from ._log import log

if TYPE_CHECKING:
    from ._profiler import Profiler

__all__ = ["CudaMemory", "Recorder"]


class CudaMemory:
    """The real calls: ``torch.cuda.memory``'s history and snapshot, and torch's OOM observer.
    A stand-in has the same methods."""

    def _torch(self) -> Any:
        import torch

        return torch

    def available(self) -> bool:
        """CUDA is there (else the feature does nothing)."""
        torch = self._torch()
        return bool(torch.cuda.is_available())

    def record(self, max_entries: int, stacks: str) -> None:
        """History on: every allocator event, with ``stacks`` ("python" | "all") frames, the
        last ``max_entries`` kept."""
        self._torch().cuda.memory._record_memory_history(
            "all", context="all", stacks=stacks, max_entries=max_entries
        )

    def stop(self) -> None:
        """History off."""
        self._torch().cuda.memory._record_memory_history(None)

    def snapshot(self) -> Any:
        """What ``_dump_snapshot`` pickles."""
        return self._torch().cuda.memory._snapshot()

    def attach_oom_observer(self, observer: Callable[..., None]) -> bool:
        """Registers ``observer`` to be called by the allocator at an out-of-memory error,
        before it raises; False when this torch has no such hook."""
        attach = getattr(getattr(self._torch(), "_C", None), "_cuda_attach_out_of_memory_observer", None)
        if attach is None:
            return False
        attach(observer)
        return True

    def is_oom(self, exc: BaseException) -> bool:
        """Is ``exc`` torch's out-of-memory error?"""
        torch = self._torch()
        oom = getattr(torch, "OutOfMemoryError", None) or getattr(torch.cuda, "OutOfMemoryError", None)
        return oom is not None and isinstance(exc, oom)


class Recorder:
    """The memory window and the OOM snapshot of one process, for one profiler."""

    def __init__(self, prof: Profiler, settings: Dict[str, Any], backend: Any, step: Callable[[], int]) -> None:
        self._prof = prof
        self._backend = backend
        self._max_entries = int(settings["max_entries"])
        self._stacks = str(settings["stacks"])
        self._oom = bool(settings["oom_snapshot"])
        self._step = step
        # Made for a triggered window (no MemoryProfilingConfig): the window is what the
        # caller says at each step, not the library's answer.
        self._triggered_only = False
        self._recording = False
        self._window_first: Optional[int] = None
        self._off = False
        self._lock = threading.Lock()
        self._oom_taken = False
        #: The OOM snapshot's path, once written.
        self.oom_path: Optional[str] = None
        self.observer_attached = False

    @classmethod
    def make(cls, prof: Profiler, backend: Any, step: Callable[[], int]) -> Optional[Recorder]:
        """A recorder when the config asks for snapshots and CUDA is there, else None; with
        ``OomSnapshot`` history is turned on now and torch's OOM observer registered."""
        try:
            settings = prof._memory_settings()
            if settings is None:
                return None
            backend = backend if backend is not None else CudaMemory()
            if not backend.available():
                log("trainprof.torch: memory snapshots need CUDA (torch.cuda.is_available() is false); they are off")
                return None
            r = cls(prof, settings, backend, step)
            if r._oom:
                r._on()
                r.observer_attached = bool(backend.attach_oom_observer(r._observer))
            return r
        except Exception as e:
            log("trainprof.torch: memory snapshots are off (%s: %s)" % (type(e).__name__, e))
            return None

    @classmethod
    def for_trigger(cls, prof: Profiler, backend: Any, step: Callable[[], int]) -> Optional[Recorder]:
        """A recorder for triggered or requested memory windows in a process without
        ``MemoryProfilingConfig`` (the config's defaults: ``MaxEntries``, Python stacks, no
        OOM snapshot), or None, with one line saying why (no CUDA: the window cannot run)."""
        try:
            settings = prof._memory_settings(defaults=True)
            if settings is None:
                return None
            backend = backend if backend is not None else CudaMemory()
            if not backend.available():
                log(
                    "trainprof.torch: a memory window was opened (trainprof trigger --memory or "
                    "AutoProfilingConfig) but cannot run: memory snapshots need CUDA "
                    "(torch.cuda.is_available() is false); no snapshot is taken"
                )
                return None
            r = cls(prof, dict(settings, oom_snapshot=False), backend, step)
            r._triggered_only = True
            return r
        except Exception as e:
            log("trainprof.torch: a memory window cannot run (%s: %s)" % (type(e).__name__, e))
            return None

    # --- history ---------------------------------------------------------------------------

    def _on(self) -> None:
        if not self._recording:
            self._backend.record(self._max_entries, self._stacks)
            self._recording = True

    def _off_unless_oom(self) -> None:
        if self._recording and not self._oom:
            self._backend.stop()
            self._recording = False

    def at_step(self, step: int, triggered: bool = False) -> None:
        """At the begin of global step ``step``: opens or closes the window. ``triggered``:
        a triggered or requested memory window is open at ``step`` (what
        ``trainprof_step_next`` said); a recorder of ``MemoryProfilingConfig`` asks the
        library instead, whose answer covers those windows too."""
        if self._off:
            return
        try:
            open_now = triggered if self._triggered_only else self._prof.active("memory", step=step)
            if open_now and self._window_first is None:
                self._on()
                self._window_first = step
            elif not open_now and self._window_first is not None:
                first, self._window_first = self._window_first, None
                self._dump(False, first, max(first, step - 1))
                self._off_unless_oom()
        except Exception as e:
            self._fail(e)

    def close(self, step: int) -> None:
        """At ``hook.close()``: a window still open is dumped, and history goes off (its
        bound no longer needed: nothing more is dumped)."""
        if self._off:
            return
        try:
            if self._window_first is not None:
                first, self._window_first = self._window_first, None
                self._dump(False, first, max(first, step))
            if self._recording:
                self._backend.stop()
                self._recording = False
        except Exception as e:
            self._fail(e)
        self._off = True

    def _fail(self, e: Exception) -> None:
        log("trainprof.torch: memory snapshots failed (%s: %s); they are off" % (type(e).__name__, e))
        self._off = True
        self._window_first = None
        try:
            if self._recording:
                self._backend.stop()
        except Exception:
            pass
        self._recording = False

    # --- the files -------------------------------------------------------------------------

    def _dump(self, oom: bool, first: int, last: int) -> Optional[str]:
        """Pickles the snapshot into a new file the library made; its path, or None."""
        snapshot = self._backend.snapshot()  # taken first: a failure leaves no empty file
        made = self._prof._memory_snapshot_create(oom, max(0, first), max(0, last))
        if made is None:
            log("trainprof.torch: no file for the memory snapshot (see above); it is not written")
            return None
        fd, path = made
        with os.fdopen(fd, "wb") as f:
            pickle.dump(snapshot, f)
        return path

    # --- out of memory ---------------------------------------------------------------------

    def _observer(self, *args: Any) -> None:
        """torch's OOM observer (device, alloc, device_allocated, device_free)."""
        self.oom()

    def oom(self) -> None:
        """The first out-of-memory error of this process: one snapshot, however often it is
        called (the observer can fire several times for one OOM: cuDNN's retries); the flight
        recorder's exception dump names it."""
        with self._lock:
            if self._oom_taken or not self._oom or self._off:
                return
            self._oom_taken = True
        try:
            path = self._dump(True, self._step(), self._step())
            if path is not None:
                self.oom_path = path
                _hang.add_exception_note("trainprof: memory snapshot at the out-of-memory error: %s" % path)
        except Exception as e:
            log("trainprof.torch: the out-of-memory snapshot failed (%s: %s)" % (type(e).__name__, e))

    def wants_forward_hook(self) -> bool:
        """``OomSnapshot`` without torch's observer: :meth:`forward_hook` is needed."""
        return self._oom and not self.observer_attached

    def forward_hook(self, module: Any, inputs: Any, outputs: Any) -> None:
        """Where torch has no OOM observer: a top-module forward hook with ``always_call``,
        which torch runs while an error leaves the forward (``outputs`` None, the error in
        ``sys.exc_info()``)."""
        if outputs is not None or self._oom_taken:
            return None
        try:
            exc = sys.exc_info()[1]
            if exc is not None and self._backend.is_oom(exc):
                self.oom()
        except Exception:
            pass
        return None
