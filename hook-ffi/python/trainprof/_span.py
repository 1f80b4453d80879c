"""What :meth:`trainprof.Profiler.record` returns: one complete event, as a context manager
(``with prof.record(...):``) or as a decorator (``@prof.record(...)``, one event per call)."""

from __future__ import annotations

import ctypes
import functools
import inspect
import time
from typing import TYPE_CHECKING, Any, Callable, Optional, Protocol, TypeVar, cast

from . import _fork

if TYPE_CHECKING:
    from ._lib import TrainprofArg


class Recorder(Protocol):
    """What a span takes from its profiler (:class:`trainprof.Profiler` is one), so that this
    module does not import the profiler's."""

    _gen: int

    def _c_record(self, *args: Any) -> int: ...

    def _record_failed(self, status: int) -> None: ...

F = TypeVar("F", bound=Callable[..., Any])

_time_ns = time.time_ns
_c_int64 = ctypes.c_int64


class Span:
    """One complete event from ``__enter__`` to ``__exit__``, of names the profiler has
    registered. The clock is Python's: ``time.time_ns() // 1000`` is the library's
    (CLOCK_REALTIME truncated to µs, :meth:`trainprof.Profiler.now_us`), read without a
    call into the library. Used as a decorator, each call of the function is one event
    (a coroutine function's: from the call to the end of the awaited coroutine)."""

    __slots__ = ("_prof", "_phase", "_name", "_step", "_args", "_nargs", "_start")

    def __init__(
        self,
        prof: Recorder,
        phase: ctypes.c_uint32,
        name: ctypes.c_uint32,
        step: ctypes.c_int64,
        args: Optional[ctypes.Array[TrainprofArg]],
        nargs: ctypes.c_uint32,
    ) -> None:
        # The arguments of trainprof_record as the profiler's one call of it takes them.
        self._prof = prof
        self._phase = phase
        self._name = name
        self._step = step
        self._args = args
        self._nargs = nargs

    def __enter__(self) -> Span:
        self._start = _time_ns()
        return self

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        end = _time_ns()
        prof = self._prof
        if prof._gen == _fork._generation:  # not in a fork()ed child
            # trainprof_record itself rather than prof._emit (which record_event calls): one
            # Python call fewer on the commonest path, 5-6 % of a `with` block's cost
            # (bench/py_ab.py, docs/python.md).
            status: int = prof._c_record(
                self._phase,
                self._name,
                _c_int64(self._start // 1000),
                _c_int64(end // 1000),
                self._step,
                self._args,
                self._nargs,
            )
            if status < 0:
                prof._record_failed(status)

    def _again(self) -> Span:
        return Span(self._prof, self._phase, self._name, self._step, self._args, self._nargs)

    def __call__(self, fn: F) -> F:
        if inspect.iscoroutinefunction(fn):

            @functools.wraps(fn)
            async def timed_async(*args: Any, **kwargs: Any) -> Any:
                with self._again():
                    return await fn(*args, **kwargs)

            return cast(F, timed_async)

        @functools.wraps(fn)
        def timed(*args: Any, **kwargs: Any) -> Any:
            with self._again():
                return fn(*args, **kwargs)

        return cast(F, timed)


class NullSpan(Span):
    """A :class:`Span` that records nothing: what :meth:`trainprof.Profiler.record` returns
    when its profiler records nothing, now or later (profiling off, closed, a ``fork()``ed
    child). As a decorator it returns the function itself."""

    __slots__ = ()

    def __init__(self) -> None:
        pass

    def __enter__(self) -> Span:
        return self

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        pass

    def __call__(self, fn: F) -> F:
        return fn


NULL_SPAN = NullSpan()
