r"""PyTorch adapter: profiling a training script with two added lines::

    import trainprof.torch
    hook = trainprof.torch.attach(model)                        # steps, detailed window
    loader = trainprof.torch.profile_dataloader(loader)         # dataloader window (optional)
    for x, y in loader:
        loss = loss_fn(model(x), y)                             # each top-level forward = one step
        ...
    hook.close()                                                # also done at exit

Steps are counted as smdebug 1.0.34's PyTorch hook counts them (docs/formats.md, "Which step each framework tests"): every call of the
top module's ``forward`` begins a step (forward pre-hook); the global step ``hook.step`` counts
every step of every mode from 0 and is the step the detailed and dataloader windows are tested
at (the dataloader one at ``hook.step + 1``, the step the next batch is for). The step's
``Step:ModeKeys.<MODE>`` event, numbered per mode, ends when the next step begins or at
:meth:`TorchHook.close`. The mode is ``train`` or ``eval`` from ``model.training``, unless
:meth:`TorchHook.set_mode` names one.

While the detailed window is open (from the pre-hook of its first step to the pre-hook of the
first step after it):

* ``Forward`` (the top module, pre-hook to forward hook) and ``Forward-SubModuleInternal``
  (every submodule, by its ``named_modules()`` name) events; the submodule hooks exist only
  while the window is open;
* ``torch.profiler`` (CPU, and CUDA where ``torch.cuda.is_available()``) runs, started and
  stopped exactly at the window's edges; at the end its op events become ``cpu_functions``
  events and its kernel events ``gpu_functions-dev:<n>`` events (docs/formats.md, "Event vocabulary"), each numbered
  with the global step it began in. With CUDA, the window leaves CUPTI detached: Kineto
  finalizes CUPTI at the end of a trace only with ``TEARDOWN_CUPTI=1`` in the environment,
  and a CUPTI left attached slows every later step, so the adapter sets
  ``TEARDOWN_CUPTI=1`` before its first trace, unless the variable is set already (the
  user's choice, or torch's own ``0`` for CUDA graphs) or CUDA is older than 12.6 (where a
  teardown can crash CUDA graphs).

Memory snapshots (``MemoryProfilingConfig``, docs/formats.md, "Memory windows"; CUDA only):
the allocator's history is on for the memory window's steps (asked at each step begin, at the
global step) and one snapshot is written at its end, then history goes off; with
``OomSnapshot`` history stays on from :func:`attach` and the process's first out-of-memory
error writes one snapshot before the error reaches the trainer (``trainprof._memory``). A
memory window ``trainprof trigger --memory`` or ``AutoProfilingConfig`` opens is recorded the
same way, also without ``MemoryProfilingConfig``: the adapter learns it from the bit of
``trainprof_step_next``'s answer, the one library call it makes at every step anyway.

``torch.compile``: the hooks never break a Dynamo graph (docs/trainer.md, "Framework adapters"). The
top module's hooks are ``torch.compiler.disable``\ d, so Dynamo never traces them and they run
as plain Python around the compiled forward, whether the hook is attached to the compiled
module or to the model that was compiled: steps, ``Forward`` and the op events come out as
without ``torch.compile``. A submodule hook that Dynamo traces into a compiled graph does
nothing (``torch.compiler.is_compiling()``): a graph cannot run Python, so the submodules
inside a compiled module give no ``Forward-SubModuleInternal`` events (those inside a
``torch.compile`` wrapper, its ``_orig_mod`` and below, are not even hooked).

This module imports torch only when it needs it (a window opens, a loader is wrapped);
``import trainprof`` never imports it. Profiling problems never raise into the training
loop: the feature concerned turns off with one ``trainprof: ...`` line on stderr and
training goes on. In a ``fork()``ed child (a DataLoader worker) every hook does nothing
(told by ``os.register_at_fork``, not by a system call per hook).
"""

from __future__ import annotations

import atexit
import bisect
import os
import sys
import threading
import time
import warnings
from typing import Any, Callable, Dict, Iterable, Iterator, List, Optional, Tuple

from . import _caps, _fork, _lib, _memory
from ._log import log
from ._profiler import Profiler

#: What torch hands a hook and what the hook returns (torch is not imported to type them).
Module = Any
_Hook = Callable[..., None]

__all__ = ["attach", "profile_dataloader", "TorchHook", "ProfiledDataLoader"]

#: Mode names :meth:`TorchHook.set_mode` accepts (``None``: from ``model.training``).
MODES = ("train", "eval", "predict", "global")

_FORWARD = "Forward"
_SUBMODULE = "Forward-SubModuleInternal"
_CPU_FUNCTIONS = "cpu_functions"
_GPU_FUNCTIONS = "gpu_functions-dev:"
_DL_ITER = "DataLoaderIter"
_DL_INIT = "DataLoaderIterInitialize"

_latest: Optional[TorchHook] = None  # the most recent TorchHook: profile_dataloader()'s default
_latest_lock = threading.Lock()


def attach(
    model: Module,
    profiler: Optional[Profiler] = None,
    mode: Any = None,
    module_events: bool = True,
    op_events: bool = True,
    profiler_options: Optional[Dict[str, Any]] = None,
    cuda_memory: Any = None,
) -> TorchHook:
    """Hooks ``model`` (a ``torch.nn.Module``): returns a :class:`TorchHook`.

    ``profiler``: the :class:`trainprof.Profiler` to record into (default: a new one for
    ``pytorch``, closed with the hook). ``mode``: a fixed mode (see :meth:`TorchHook.set_mode`).
    ``module_events`` / ``op_events``: the ``Forward`` events and the ``torch.profiler`` op
    events of the detailed window, each on by default. ``profiler_options``: more keyword
    arguments for ``torch.profiler.profile`` in the detailed window (``{"with_stack": True,
    "record_shapes": True}``); the window's caps bound what they cost (docs/formats.md,
    "Window caps"). ``cuda_memory``: what records and snapshots CUDA memory for
    ``MemoryProfilingConfig`` (docs/formats.md, "Memory windows"; default: torch's own
    calls, ``trainprof._memory.CudaMemory``; a stand-in with the same methods for tests).

    Profiling problems never raise: when the library cannot be loaded or the model cannot be
    hooked, a warning says so and the returned hook does nothing. An unknown ``mode`` raises
    ``ValueError``."""
    hook = TorchHook(
        model,
        profiler,
        mode=mode,
        module_events=module_events,
        op_events=op_events,
        profiler_options=profiler_options,
        cuda_memory=cuda_memory,
    )
    global _latest
    with _latest_lock:
        _latest = hook
    return hook


def profile_dataloader(loader: Any, name: Optional[str] = None, hook: Optional[TorchHook] = None) -> ProfiledDataLoader:
    """Wraps ``loader`` (a ``torch.utils.data.DataLoader`` or anything iterable with
    ``num_workers`` / ``pin_memory``) so that its iterators record, while the dataloader
    window is open for the metrics name at the next step:

    * ``DataLoaderIterInitialize`` / ``<iterator class>.__init__`` (``iter(loader)``, which
      starts the worker processes), with ``num_workers`` and ``pin_memory``;
    * ``DataLoaderIter`` / ``<iterator class>.DataLoaderIter::GetNext`` for each batch.

    Both are numbered with the step they were tested at (``hook.step + 1``, the step the
    batch is for). ``worker_id`` (which worker made a batch) is not written: no public
    PyTorch API tells the training process.

    ``name``: the metrics name the config's ``MetricsRegex`` is matched against (default:
    each event's own name). ``hook``: the :class:`TorchHook` whose step counts (default: the
    latest :func:`attach`). The wrapper passes everything else through to ``loader``."""
    return ProfiledDataLoader(loader, name=name, hook=hook)


def _not_compiling() -> bool:
    return False


def _compiler() -> Tuple[Optional[Callable[[_Hook], _Hook]], Callable[[], bool]]:
    """``(disable, is_compiling)``: ``torch.compiler``'s, when torch is imported and has
    them, else a pass-through and a function that answers False. torch is not imported
    here: a model to hook means it already is."""
    comp = getattr(sys.modules.get("torch"), "compiler", None)
    disable = getattr(comp, "disable", None)
    is_compiling = getattr(comp, "is_compiling", None)
    return (
        disable if callable(disable) else None,
        is_compiling if callable(is_compiling) else _not_compiling,
    )


def _untraced(fn: _Hook, disable: Optional[Callable[[_Hook], _Hook]]) -> _Hook:
    """``fn`` as Dynamo never traces it (``torch.compiler.disable``); ``fn`` itself when
    that is not there or fails."""
    if disable is None:
        return fn
    try:
        return disable(fn)
    except Exception:
        return fn


# torch.profiler (2.4 to 2.10) warns at every ``profile()`` without a schedule that it
# "clears events at the end of each cycle": true of cycles the adapter never uses, and
# addressed to whoever chose the profiler's arguments, which the user did not.
_CYCLE_WARNING = r"(?s).*Profiler clears events at the end of each cycle"


class _quiet_profiler(warnings.catch_warnings):
    """Around the adapter's own torch.profiler calls: that one warning is dropped, every
    other warning goes through the user's filters as before (the filters are
    process-wide; they are changed only for the length of these calls)."""

    def __enter__(self) -> Any:
        r = super().__enter__()
        warnings.filterwarnings("ignore", message=_CYCLE_WARNING, category=UserWarning)
        return r


def _mode_of(mode: Any) -> Optional[str]:
    if mode is None:
        return None
    if isinstance(mode, str):
        m = mode.lower()
    else:  # smdebug's ModeKeys (ModeKeys.TRAIN) and friends
        m = str(getattr(mode, "name", mode)).rsplit(".", 1)[-1].lower()
    if m not in MODES:
        raise ValueError("mode must be one of %s or None, not %r" % (", ".join(MODES), mode))
    return m


class TorchHook:
    """What :func:`attach` returns: the hooks on one model and the state they share."""

    _prof: Profiler  # the profiler, once there is one

    def __init__(
        self,
        model: Module,
        profiler: Optional[Profiler] = None,
        mode: Any = None,
        module_events: bool = True,
        op_events: bool = True,
        profiler_options: Optional[Dict[str, Any]] = None,
        cuda_memory: Any = None,
    ) -> None:
        self._gen = _fork.generation()
        # Memory snapshots (docs/formats.md, "Memory windows"), when configured or once a
        # triggered memory window opened; ``_memory_tried``: no other recorder is made.
        self._memory: Optional[_memory.Recorder] = None
        self._memory_tried = False
        self._cuda_memory = cuda_memory
        self._profiler_options: Dict[str, Any] = dict(profiler_options or {})
        # The detailed window's caps (docs/formats.md, "Window caps"), read when it opens:
        # the trainer's resident memory then, and the events it wrote so far.
        self._caps: Dict[str, int] = dict(_caps.DEFAULTS)
        self._rss0 = 0
        self._rss_stop = 0
        self._window_events = 0
        self._capped = False  # the detailed window was stopped at a cap (said once)
        self._trace_cpu_only = False
        self._fixed_mode = _mode_of(mode)
        self._model = model
        self._own_profiler = False
        self._handles: List[Any] = []  # the top module's hook handles
        self._sub_handles: List[Any] = []  # the submodules' hook handles, while the window is open
        self._sub_starts: Dict[str, List[int]] = {}  # submodule name -> start times of its unfinished calls
        self._module_events = bool(module_events)
        self._op_events = bool(op_events)
        self.step = -1  # the global step (smdebug's self.step); -1 before the first
        self._in_step = False
        self._detailed = False  # is the detailed window open (at the current step)?
        self._forward_start: Optional[int] = None
        # torch.compile(model) is an OptimizedModule around the model: name the model.
        inner = getattr(model, "_orig_mod", None) if type(model).__name__ == "OptimizedModule" else None
        self._top_name = type(model if inner is None else inner).__name__
        self._closed = False
        # torch.profiler while it runs: the profile object, and (global step, µs) at each
        # step begin inside the window, to number the op events.
        self._torch_prof: Any = None
        self._torch_start_us = 0
        self._boundaries: List[Tuple[int, int]] = []
        #: The :class:`trainprof.Profiler` recorded into (None when there is none).
        self.profiler: Optional[Profiler] = None
        try:
            if profiler is None:
                profiler = Profiler(framework="pytorch")
                if profiler._library_missing:  # the Profiler said why, in one line
                    self._closed = True
                    return
                self._own_profiler = True
            self.profiler = self._prof = profiler
        except Exception as e:  # LibraryError or anything else: training goes on unprofiled
            log("trainprof.torch.attach: no profiler (%s: %s); profiling is off" % (type(e).__name__, e))
            self._closed = True
            return
        self._disable, self._is_compiling = _compiler()
        try:
            self._handles.append(model.register_forward_pre_hook(_untraced(self._pre_hook, self._disable)))
            self._handles.append(model.register_forward_hook(_untraced(self._post_hook, self._disable)))
        except Exception as e:
            log(
                "trainprof.torch.attach: cannot hook %s (%s: %s); profiling is off"
                % (self._top_name, type(e).__name__, e)
            )
            self._remove(self._handles)
            self._closed = True
            return
        self._memory = _memory.Recorder.make(profiler, cuda_memory, lambda: max(self.step, 0))
        # A configured feature already said why it has no recorder (no CUDA): said once.
        self._memory_tried = self._memory is not None or profiler._memory_settings() is not None
        if self._memory is not None and self._memory.wants_forward_hook():
            try:
                hook = _untraced(self._memory.forward_hook, self._disable)
                self._handles.append(model.register_forward_hook(hook, always_call=True))
            except Exception as e:
                log(
                    "trainprof.torch: no out-of-memory observer and no always_call forward hook (%s: %s); "
                    "no snapshot at an out-of-memory error" % (type(e).__name__, e)
                )
        atexit.register(self._at_exit)

    # --- state ---------------------------------------------------------------------------

    def __repr__(self) -> str:
        return "<trainprof.torch.TorchHook %s step=%d%s>" % (
            self._top_name,
            self.step,
            " closed" if self._closed else "",
        )

    def _live(self) -> bool:
        return not self._closed and _fork.generation() == self._gen

    @property
    def mode(self) -> str:
        """The mode of the next step: the fixed one, else ``train`` / ``eval`` from
        ``model.training``."""
        if self._fixed_mode is not None:
            return self._fixed_mode
        return "train" if getattr(self._model, "training", True) else "eval"

    def set_mode(self, mode: Any) -> None:
        """Fixes the mode of the following steps (``train`` | ``eval`` | ``predict`` |
        ``global``, or smdebug's ``ModeKeys``), as smdebug's ``hook.set_mode`` does; ``None``
        goes back to ``model.training``."""
        self._fixed_mode = _mode_of(mode)

    # --- the top module's hooks ------------------------------------------------------------

    def _pre_hook(self, module: Module, inputs: Any) -> None:
        if self._closed or _fork._generation != self._gen:
            return None
        try:
            self._begin_step()
        except Exception as e:
            log("trainprof.torch: step begin failed (%s: %s)" % (type(e).__name__, e), key="torch-pre-hook")
        return None

    def _post_hook(self, module: Module, inputs: Any, outputs: Any) -> None:
        if self._closed or _fork._generation != self._gen:
            return None
        prof = self._prof
        try:
            if self._forward_start is not None:
                start, self._forward_start = self._forward_start, None
                prof.record_event(_FORWARD, self._top_name, start, max(start, prof.now_us()))
                self._window_events += 1
            prof.forward_end()
        except Exception as e:
            log("trainprof.torch: forward end failed (%s: %s)" % (type(e).__name__, e), key="torch-post-hook")
        return None

    def _begin_step(self) -> None:
        prof = self._prof
        mode = self._fixed_mode
        if mode is None:
            mode = "train" if getattr(self._model, "training", True) else "eval"
        # Every step after the first: step end, step begin, the step-start Python boundary
        # and the detailed-window question in one library call, when it can be made.
        windows = prof._step_next(mode, self.step + 1) if self._in_step else None
        # A triggered or requested memory window: a bit of the same call, no call of its own.
        memory = windows is not None and bool(windows & _lib.STEP_NEXT_MEMORY)
        detailed = None if windows is None else bool(windows & _lib.STEP_NEXT_DETAILED)
        if detailed is None:
            if self._in_step:
                self._in_step = False
                prof.step_end()
            self.step += 1
            prof.step_begin(mode)
            self._in_step = True
            if self._sub_starts:
                self._sub_starts.clear()  # calls a raised exception left unfinished
            detailed = prof.active("detailed", step=self.step)
        else:
            self.step += 1
            if self._sub_starts:
                self._sub_starts.clear()
        if self._memory is None and memory and not self._memory_tried:
            self._memory_tried = True
            self._memory = _memory.Recorder.for_trigger(prof, self._cuda_memory, lambda: max(self.step, 0))
        if self._memory is not None:
            self._memory.at_step(self.step, memory)
        if detailed and self._detailed and self._over_cap():
            detailed = False  # stopped at its cap: closed below, this step not profiled
        if detailed and not self._detailed:
            self._open_detailed()
        elif not detailed and self._detailed:
            self._close_detailed()
        if self._detailed:
            if self._torch_prof is not None:
                self._boundaries.append((prof.now_us(), self.step))
            self._forward_start = prof.now_us() if self._module_events else None

    # --- the detailed window ----------------------------------------------------------------

    def _over_cap(self) -> bool:
        """At a step boundary inside the detailed window: has the window reached a cap (the
        trainer's resident memory grown by ``detailed_max_bytes`` since it opened, or
        ``detailed_max_events`` events written)? If so the library is told, at this step."""
        caps = self._caps
        grown = _caps.rss_bytes() - self._rss0 if self._rss0 else 0
        if grown >= caps["detailed_max_bytes"]:
            cap, value, limit = "bytes", grown, caps["detailed_max_bytes"]
        elif self._window_events >= caps["detailed_max_events"]:
            cap, value, limit = "events", self._window_events, caps["detailed_max_events"]
        else:
            return False
        self._prof.window_capped("detailed", cap, value, limit, step=self.step)
        self._capped = True
        return True

    def _open_detailed(self) -> None:
        t0 = time.perf_counter_ns()
        try:
            self._open_detailed_window()
        finally:
            self._prof._add_cost("window.detailed.open", time.perf_counter_ns() - t0)

    def _close_detailed(self) -> None:
        t0 = time.perf_counter_ns()
        try:
            self._close_detailed_window()
        finally:
            self._prof._add_cost("window.detailed.close", time.perf_counter_ns() - t0)

    def _open_detailed_window(self) -> None:
        self._detailed = True
        self._caps = self._prof.window_caps()
        self._window_events = 0
        self._capped = False
        self._rss0 = _caps.rss_bytes()
        if self._module_events:
            self._hook_submodules()
        if self._op_events:
            self._start_torch_profiler()

    def _close_detailed_window(self) -> None:
        self._detailed = False
        self._forward_start = None
        self._remove(self._sub_handles)
        self._sub_starts.clear()
        self._stop_torch_profiler()

    def _hook_submodules(self) -> None:
        try:
            modules = list(self._model.named_modules())
            # The model inside a torch.compile wrapper (OptimizedModule), and everything in
            # it, runs as a compiled graph: its hooks could give no event (see the module
            # docs), so they are not even registered.
            inside = tuple(
                (n + "." if n else "") + "_orig_mod" for n, m in modules if type(m).__name__ == "OptimizedModule"
            )
            for name, sub in modules:
                if sub is self._model or not name:
                    continue
                if any(name == p or name.startswith(p + ".") for p in inside):
                    continue
                pre, post = self._submodule_hooks(name)
                self._sub_handles.append(sub.register_forward_pre_hook(pre))
                self._sub_handles.append(sub.register_forward_hook(post))
        except Exception as e:
            log(
                "trainprof.torch: cannot hook the submodules (%s: %s); Forward-SubModuleInternal events are off"
                % (type(e).__name__, e)
            )
            self._remove(self._sub_handles)
            self._module_events = False

    def _submodule_hooks(self, name: str) -> Tuple[_Hook, _Hook]:
        """The hooks of submodule ``name``. Traced into a compiled graph (Dynamo), they do
        nothing: ``is_compiling()`` is True while Dynamo traces, so the graph gets no call
        and no break; called as Python, they run their untraced bodies."""
        starts = self._sub_starts
        prof = self._prof
        is_compiling = self._is_compiling

        def pre_body(module: Module, inputs: Any) -> None:
            if not self._live():
                return None
            try:
                starts.setdefault(name, []).append(prof.now_us())
            except Exception:
                pass
            return None

        def post_body(module: Module, inputs: Any, outputs: Any) -> None:
            if not self._live():
                return None
            try:
                stack = starts.get(name)
                if stack:
                    start = stack.pop()
                    prof.record_event(_SUBMODULE, name, start, max(start, prof.now_us()))
                    self._window_events += 1
            except Exception as e:
                log("trainprof.torch: submodule event failed (%s: %s)" % (type(e).__name__, e), key="torch-sub")
            return None

        pre_body = _untraced(pre_body, self._disable)
        post_body = _untraced(post_body, self._disable)

        def pre(module: Module, inputs: Any) -> None:
            if is_compiling():
                return None
            return pre_body(module, inputs)

        def post(module: Module, inputs: Any, outputs: Any) -> None:
            if is_compiling():
                return None
            return post_body(module, inputs, outputs)

        return pre, post

    @staticmethod
    def _remove(handles: List[Any]) -> None:
        while handles:
            h = handles.pop()
            try:
                h.remove()
            except Exception:
                pass

    def _start_torch_profiler(self) -> None:
        try:
            import torch
            from torch.profiler import ProfilerActivity, profile, supported_activities

            activities = [ProfilerActivity.CPU]
            cuda = getattr(ProfilerActivity, "CUDA", None)
            if cuda is not None and cuda in supported_activities() and torch.cuda.is_available():
                activities.append(cuda)
                _let_kineto_detach_cupti(torch)
            with _quiet_profiler():
                tp = profile(activities=activities, **self._profiler_options)
                t0 = self._prof.now_us()
                tp.start()
        except Exception as e:
            log(
                "trainprof.torch: torch.profiler cannot run here (%s: %s); cpu_functions / gpu_functions events are off"
                % (type(e).__name__, e)
            )
            self._op_events = False
            return
        self._torch_prof = tp
        # Only a CPU trace is handed to the library (_hand_over_trace): device events are
        # read in Python, as before.
        self._trace_cpu_only = activities == [ProfilerActivity.CPU]
        self._torch_start_us = t0
        self._boundaries = [(t0, self.step)]

    def _stop_torch_profiler(self) -> None:
        tp, self._torch_prof = self._torch_prof, None
        if tp is None:
            return
        boundaries, self._boundaries = self._boundaries, []
        # Writing the events may grow the trainer by the memory cap at most, from here.
        self._rss_stop = _caps.rss_bytes()
        try:
            with _quiet_profiler():
                tp.stop()
            if self._trace_cpu_only and self._hand_over_trace(tp, boundaries):
                return
            with _quiet_profiler():
                events = _profiler_events(tp)
            base_us = self._trace_start_us(tp)
            self._record_ops(events, base_us, boundaries)
        except Exception as e:
            log(
                "trainprof.torch: reading torch.profiler's events failed (%s: %s); op events are off"
                % (type(e).__name__, e)
            )
            self._op_events = False

    def _hand_over_trace(self, tp: Any, boundaries: List[Tuple[int, int]]) -> bool:
        """The window's ops written off the training thread (docs/formats.md, "Detailed
        windows through torch's own trace"): torch writes its own chrome trace (its C++
        ``kineto_results.save``, what ``export_chrome_trace`` calls) into a file the library
        made for it, and the library's writer thread streams that file into ``cpu_functions``
        events and removes it. Here, on the training thread, the close then costs what plain
        torch.profiler's ``stop()`` and ``export_chrome_trace`` cost: reading torch's results
        in Python, one ctypes call an event, cost 5-7x as much (docs/trainer.md, "Framework
        adapters: `trainprof.torch` and `trainprof.keras`"). False (the caller reads the
        events in Python) when this cannot be done: a library or torch without it, or
        torch failing to write its trace (one line)."""
        prof = self._prof
        results = getattr(getattr(tp, "profiler", None), "kineto_results", None)
        save = getattr(results, "save", None)
        if not callable(save):
            return False
        made = prof._torch_trace_create()
        if made is None:
            return False
        token, path = made
        try:
            with _quiet_profiler():
                save(path)
        except Exception as e:
            prof._torch_trace_discard(token)
            log(
                "trainprof.torch: torch.profiler could not write its trace (%s: %s); its events are read in Python"
                % (type(e).__name__, e),
                key="torch-trace-save",
            )
            return False
        if prof._torch_trace_import(
            token, boundaries, self._window_events, self._caps["detailed_max_events"], not self._capped
        ):
            return True
        prof._torch_trace_discard(token)
        return False

    def _trace_start_us(self, tp: Any) -> float:
        """The epoch µs that torch.profiler's event times count from: the trace start it
        reports, else the time just before ``start()`` (with one warning)."""
        try:
            ns = tp.profiler.kineto_results.trace_start_ns()
            if isinstance(ns, int) and ns > 0:
                return ns / 1000.0
        except Exception:
            pass
        log("trainprof.torch: torch.profiler does not report its trace start; op times are approximate")
        return float(self._torch_start_us)

    def _record_ops(self, events: Iterable[Any], base_us: float, boundaries: List[Tuple[int, int]]) -> None:
        """One ``cpu_functions`` / ``gpu_functions-dev:<n>`` event per profiler event
        (docs/formats.md, "Event vocabulary"), numbered with the global step it began in.

        A kernel's launch is the CUDA runtime or driver call (``cudaLaunchKernel``,
        ``cuLaunchKernelEx``, ``cudaMemcpyAsync``, ...) with the kernel's correlation id: torch
        gives both the CUPTI correlation id as ``id`` (an operator's ``id`` is its own
        sequence, which can alias it, so only runtime calls are looked up: a CPU event linked to
        an operator, or named ``cu*`` / ``hip*``). What a torch version does not expose is left
        out of ``args``, never guessed."""
        prof = self._prof
        times = [t for t, _ in boundaries]
        events = list(events)
        launches: Dict[int, Any] = {}
        for e in events:
            if _device_kind(e) != "CPU":
                continue
            corr = _int_or(getattr(e, "id", None), 0)
            linked = _int_or(getattr(e, "linked_correlation_id", 0), 0)
            name = str(getattr(e, "name", ""))
            if corr > 0 and (linked > 0 or name.startswith(("cu", "hip"))):
                launches.setdefault(corr, e)
        max_events, max_bytes = self._caps["detailed_max_events"], self._caps["detailed_max_bytes"]
        for n, e in enumerate(events):
            tr = e.time_range
            # Whole µs (what the library keeps; ints take the profiler's fast path).
            start = int(base_us + tr.start)
            end = max(start, int(base_us + tr.end))
            i = bisect.bisect_right(times, start) - 1
            step = boundaries[max(i, 0)][1]
            # The caps hold while the events are written too: the rest are left out.
            if self._window_events >= max_events:
                prof.window_capped("detailed", "events", self._window_events, max_events, step=step)
                return
            if n % 4096 == 4095 and self._rss_stop:
                grown = _caps.rss_bytes() - self._rss_stop
                if grown >= max_bytes:
                    prof.window_capped("detailed", "bytes", grown, max_bytes, step=step)
                    return
            self._window_events += 1
            kind = _device_kind(e)
            thread = _int_or(getattr(e, "thread", 0), 0)
            if kind == "CPU":
                # smdebug writes device: "cpu"; the library takes numbers only, so it is left out.
                cpu_args = {"tid": thread}
                if e.name.startswith(_COLLECTIVE_PREFIXES):
                    cpu_args.update(_message(getattr(e, "input_shapes", None), getattr(e, "input_dtypes", None)))
                prof.record_event(_CPU_FUNCTIONS, e.name, start, end, step=step, args=cpu_args)
            else:
                # The library takes 4 args an event: the device, the stream, the correlation
                # id and the launch's start (or, for a device range that is no kernel, the
                # mark `annotation`); the launching thread and a `tid` copy of the device,
                # written before, gave way to them.
                device = _int_or(getattr(e, "device_index", 0), 0)
                args = {"device": device}
                stream = _int_or(getattr(e, "device_resource_id", None), -1)
                if stream >= 0:
                    args["stream"] = stream
                corr = _int_or(getattr(e, "id", None), 0)
                launch = launches.get(corr) if corr > 0 else None
                if corr > 0:
                    args["correlation"] = corr
                if getattr(e, "is_user_annotation", False) is True:
                    # A record_function range drawn on the device (gpu_user_annotation), not a kernel.
                    args["annotation"] = 1
                elif launch is not None and launch.time_range.start <= tr.start:
                    args["cpu_thread_start_time"] = int(base_us + launch.time_range.start)
                prof.record_event(_GPU_FUNCTIONS + str(device), e.name, start, end, step=step, args=args)

    # --- the end -----------------------------------------------------------------------------

    def close(self) -> None:
        """Ends the running step and the detailed window, removes the hooks, and closes the
        profiler if :func:`attach` made it. Idempotent; never raises."""
        if not self._live():
            return None
        try:
            if self._detailed:
                self._close_detailed()
            if self._memory is not None:
                self._memory.close(self.step)
            if self._in_step:
                self._in_step = False
                self._prof.step_end()
        except Exception as e:
            log("trainprof.torch: close failed (%s: %s)" % (type(e).__name__, e))
        self._closed = True
        self._remove(self._handles)
        self._remove(self._sub_handles)
        if self._own_profiler:
            self._prof.close()
        return None

    def _at_exit(self) -> None:
        if _fork.generation() == self._gen:
            self.close()


# Kineto finalizes CUPTI (cuptiFinalize) when a trace with CUDA activities ends only when
# this variable is "1" then (it is read with getenv at that moment). Otherwise CUPTI stays
# attached to the CUDA context for the rest of the process, and every later step pays for
# it. (Kineto leaves it off by default because a teardown could crash CUDA graphs.)
_TEARDOWN_CUPTI = "TEARDOWN_CUPTI"
# CUDA graphs may crash when CUPTI is finalized and attached again with older CUDA
# (torch.profiler itself sets TEARDOWN_CUPTI=0 there when it sees CUDA graphs).
_TEARDOWN_MIN_CUDA = (12, 6)


def _let_kineto_detach_cupti(torch: Any) -> None:
    """Sets ``TEARDOWN_CUPTI=1`` (for the process: Kineto reads it again when it attaches
    CUPTI for the next trace) unless it is set already or CUDA is older than 12.6."""
    if _TEARDOWN_CUPTI in os.environ:
        return
    cuda = getattr(getattr(torch, "version", None), "cuda", None)  # "12.8"; None without CUDA
    try:
        version = tuple(int(p) for p in str(cuda).split(".")[:2])
    except ValueError:
        return
    if version < _TEARDOWN_MIN_CUDA:
        return
    os.environ[_TEARDOWN_CUPTI] = "1"


class _Range:
    __slots__ = ("start", "end")

    def __init__(self, start: float, end: float) -> None:
        self.start = start
        self.end = end


# A collective's events (docs/formats.md, "Collectives"): the dispatcher's op, the backends'
# ranges. Their message is written from torch's recorded shapes (``record_shapes``), as the
# library does from torch's trace (output/src/protocol/timeline.rs, ``collective``).
_COLLECTIVE_PREFIXES = ("c10d::", "gloo:", "nccl:")
_MSG_BYTES = "msg_bytes"
_SCALAR_TYPE = "scalar_type"
_MAX_INPUTS = 16
_MAX_ELEMENTS = 1 << 50
# torch.profiler's input type names: (c10's ScalarType number, bytes an element).
_SCALAR_TYPES: Dict[str, Tuple[int, int]] = {
    "unsigned char": (0, 1),
    "signed char": (1, 1),
    "short int": (2, 2),
    "int": (3, 4),
    "long int": (4, 8),
    "c10::Half": (5, 2),
    "float": (6, 4),
    "double": (7, 8),
    "c10::complex<c10::Half>": (8, 4),
    "c10::complex<float>": (9, 8),
    "c10::complex<double>": (10, 16),
    "bool": (11, 1),
    "c10::BFloat16": (15, 2),
    "c10::Float8_e5m2": (23, 1),
    "c10::Float8_e4m3fn": (24, 1),
    "c10::Float8_e5m2fnuz": (25, 1),
    "c10::Float8_e4m3fnuz": (26, 1),
    "short unsigned int": (27, 2),
    "unsigned int": (28, 4),
    "long unsigned int": (29, 8),
}


def _message(shapes: Any, dtypes: Any) -> Dict[str, int]:
    """A collective's ``msg_bytes`` and ``scalar_type`` from its inputs' shapes and types
    (docs/formats.md, "Collectives"): every input with dimensions a tensor of a known type
    (else nothing: a ``TensorList``, an unknown type), one with none a scalar tensor of a
    known type or no tensor; at most 16 inputs."""
    if not isinstance(shapes, (list, tuple)) or not isinstance(dtypes, (list, tuple)) or len(shapes) > _MAX_INPUTS:
        return {}
    total = 0
    codes = set()
    for i, dims in enumerate(shapes):
        t = dtypes[i] if i < len(dtypes) else None
        known = _SCALAR_TYPES.get(t) if isinstance(t, str) else None
        if not isinstance(dims, (list, tuple)):
            return {}
        n = 1
        if not dims:
            if known is None:
                continue
        else:
            if known is None:
                return {}
            for d in dims:
                if type(d) is not int or d < 0:
                    return {}
                n *= d
                if n > _MAX_ELEMENTS:
                    return {}
        total += n * known[1]
        codes.add(known[0])
    if not codes:
        return {}
    out = {_MSG_BYTES: total}
    if len(codes) == 1:
        out[_SCALAR_TYPE] = codes.pop()
    return out


class _Op:
    """One event of torch.profiler's raw results, with the attributes of its ``FunctionEvent``
    that :meth:`TorchHook._record_ops` reads (times in µs from the trace start); what only a
    device event needs is read when asked for."""

    __slots__ = ("name", "time_range", "id", "linked_correlation_id", "thread", "device_type", "_e")

    def __init__(self, e: Any, trace_start_ns: int, rename: Callable[[str], str]) -> None:
        self.name = rename(e.name())
        self.time_range = _Range((e.start_ns() - trace_start_ns) / 1000.0, (e.end_ns() - trace_start_ns) / 1000.0)
        self.id = e.correlation_id()
        self.linked_correlation_id = e.linked_correlation_id()
        self.thread = e.start_thread_id()
        self.device_type = e.device_type()
        self._e = e

    @property
    def device_index(self) -> Any:
        return self._e.device_index()

    @property
    def device_resource_id(self) -> Any:
        return self._e.device_resource_id()

    @property
    def is_user_annotation(self) -> Any:
        return self._e.is_user_annotation()

    @property
    def input_shapes(self) -> Any:
        return self._e.shapes()

    @property
    def input_dtypes(self) -> Any:
        return self._e.dtypes()


def _profiler_events(tp: Any) -> Iterable[Any]:
    """torch.profiler's events once it stopped. ``tp.events()`` builds a ``FunctionEvent``
    tree in Python (parents, children, memory, stacks): on a CPU model of a few hundred ops a
    step that took 4.4 s for 5 steps (15,000 events), against 0.07 s to read the raw results
    it is built from (docs/trainer.md, "Framework adapters: `trainprof.torch` and
    `trainprof.keras`"). The raw results are read here with torch's own filter and renaming:
    the same events and names as ``tp.events()``; a torch without them falls back to it."""
    try:
        from torch.autograd.profiler_util import _filter_name, _rewrite_name

        results = tp.profiler.kineto_results
        trace_start_ns = int(results.trace_start_ns())
        raw = results.events()
        renamed: Dict[str, str] = {}  # a few hundred names among thousands of events

        def rename(name: str) -> str:
            r = renamed.get(name)
            if r is None:
                r = renamed[name] = str(_rewrite_name(name=name, with_wildcard=True))
            return r

        ops = []
        for e in raw:
            if _filter_name(e.name()) or getattr(e, "is_hidden_event", lambda: False)():
                continue
            ops.append(_Op(e, trace_start_ns, rename))
        return ops
    except Exception:
        events: Iterable[Any] = tp.events()
        return events


def _device_kind(event: Any) -> str:
    """``CPU``, ``CUDA``, ... from a profiler event's ``device_type``."""
    dt = getattr(event, "device_type", None)
    name = getattr(dt, "name", None)
    if name is None:
        name = str(dt).rsplit(".", 1)[-1]
    return name.upper()


def _int_or(v: Any, default: int) -> int:
    try:
        return int(v)
    except Exception:
        return default


class ProfiledDataLoader:
    """What :func:`profile_dataloader` returns: ``loader`` with profiled iterators."""

    def __init__(self, loader: Any, name: Optional[str] = None, hook: Optional[TorchHook] = None) -> None:
        self._loader = loader
        self._name = name
        self._hook = hook
        self._gen = _fork.generation()
        # The events written in the current dataloader window, and its cap (docs/formats.md,
        # "Window caps"), read when the window opens.
        self._was_active = False
        self._events = 0
        self._limit = _caps.DEFAULTS["dataloader_max_events"]

    def __getattr__(self, attr: str) -> Any:
        loader = self.__dict__.get("_loader")
        if loader is None:
            raise AttributeError(attr)
        return getattr(loader, attr)

    def __len__(self) -> int:
        return len(self._loader)

    def __repr__(self) -> str:
        return "<trainprof.torch.ProfiledDataLoader of %r>" % (self._loader,)

    def _target(self) -> Optional[Tuple[Profiler, int]]:
        """(profiler, step to test) or None when nothing is to be recorded."""
        if _fork.generation() != self._gen:
            return None
        hook = self._hook or _latest
        if hook is None:
            log("trainprof.torch.profile_dataloader: no attach()ed model; dataloader events are off", key="dl-no-hook")
            return None
        if not hook._live():
            return None
        return hook._prof, hook.step + 1

    def _active(self, target: Tuple[Profiler, int], event_name: str) -> bool:
        prof, step = target
        active = prof.active("dataloader", self._name or event_name, step=step)
        if active and not self._was_active:
            self._events = 0
            self._limit = prof.window_caps()["dataloader_max_events"]
        self._was_active = active
        return active

    def _counted(self, target: Tuple[Profiler, int]) -> bool:
        """One more event written; False once it reached the window's cap (the library is
        told, and answers no for the rest of the window)."""
        self._events += 1
        if self._events < self._limit:
            return True
        target[0].window_capped("dataloader", "events", self._events, self._limit, step=target[1])
        self._was_active = False
        return False

    def __iter__(self) -> Iterator[Any]:
        target = None
        try:
            target = self._target()
            t0 = target[0].now_us() if target else 0
        except Exception as e:
            log("trainprof.torch: dataloader profiling failed (%s: %s); it is off" % (type(e).__name__, e), key="dl")
            target = None
        it = iter(self._loader)
        init_name = next_name = None
        try:
            if target is not None:
                prof = target[0]
                t1 = prof.now_us()
                cls = type(it).__name__
                init_name = cls + ".__init__"
                next_name = cls + "." + _DL_ITER + "::GetNext"
                if self._active(target, init_name):
                    args = {
                        "num_workers": _int_or(getattr(self._loader, "num_workers", 0), 0),
                        "pin_memory": bool(getattr(self._loader, "pin_memory", False)),
                    }
                    prof.record_event(_DL_INIT, init_name, t0, max(t0, t1), step=target[1], args=args)
                    self._counted(target)
        except Exception as e:
            log("trainprof.torch: dataloader profiling failed (%s: %s); it is off" % (type(e).__name__, e), key="dl")
            next_name = None
        return self._batches(it, next_name)

    def _batches(self, it: Iterator[Any], next_name: Optional[str]) -> Iterator[Any]:
        checked_step = None  # the window answer is asked once per step
        active = False
        while True:
            target = None
            if next_name is not None:
                try:
                    target = self._target()
                    if target is not None and target[1] != checked_step:
                        checked_step = target[1]
                        active = self._active(target, next_name)
                    if not active:
                        target = None
                    t0 = target[0].now_us() if target else 0
                except Exception as e:
                    log(
                        "trainprof.torch: dataloader profiling failed (%s: %s); it is off" % (type(e).__name__, e),
                        key="dl",
                    )
                    next_name = target = None
            try:
                batch = next(it)
            except StopIteration:
                return
            if target is not None and next_name is not None:
                try:
                    prof = target[0]
                    prof.record_event(_DL_ITER, next_name, t0, max(t0, prof.now_us()), step=target[1])
                    if not self._counted(target):
                        active = False
                except Exception as e:
                    log(
                        "trainprof.torch: dataloader profiling failed (%s: %s); it is off" % (type(e).__name__, e),
                        key="dl",
                    )
                    next_name = None
            yield batch
