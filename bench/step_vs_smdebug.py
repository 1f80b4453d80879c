"""Benchmark (not a test): what profiling costs the training thread per training step, the
`trainprof` Python package against smdebug 1.0.34's PyTorch hook doing the same per-step
work, side by side in one run.

    cargo build --release -q -p trainprof-hook
    TRAINPROF_HOOK_LIB=$PWD/target/release/libtrainprof_hook.so PYTHONPATH=$PWD/hook-ffi/python \\
        .venv/bin/python bench/step_vs_smdebug.py 2>&1 | grep -v '^trainprof-hook\\['

Two phases, each timed in batches of 100 steps with time.perf_counter_ns:
  * BENCH_STEPS (20000) steps back to back. smdebug's writer thread then competes with the
    training thread for the GIL, so most of its work lands on the training thread.
  * BENCH_GAP_STEPS (4000) steps, each with a GIL-free "forward pass" of about BENCH_GAP_US
    (1000) µs between the hook calls, only the time in the hook calls being summed (four
    perf_counter_ns reads a step, well under 1 µs, are in both sides' numbers). The
    forward is hashlib.sha256 of a buffer, which keeps the core busy with the GIL released,
    as torch does inside an op (a sleep would let the CPU go cold and slow the next Python
    calls of both sides several-fold). smdebug's writer can write during it, though its
    pre-hook, which queues the events and then reads the config file, still wakes the writer
    and then waits for the GIL at each file operation. The forward also evicts the caches,
    as a real one does, so the hook calls after it run slower than back to back on both
    sides (on a 2-vCPU VM: smdebug's config read 4-5x, trainprof's ctypes calls ~1.5x).
Both sides live in one process and take turns: BENCH_ROUNDS (4) rounds, each running a
quarter of both phases on one side then the other (which goes first alternates), so what
else the machine does at the time is shared between them; the table also shows each round's
p50. BENCH_WARMUP (200) untimed steps come before each phase, and after each side is made
(its first step ends the pre-step-zero cProfile run and opens the timeline file).

Both sides read the same config (ProfilingParameters as the SageMaker SDK writes them: every
sub-config a string, every window configured but starting at step 1e9, so all of them stay
closed: the steady state of a job between its profiling windows), each with LocalPath in its
own temporary folder. SMPROFILER_CONFIG_PATH names smdebug's file while the rounds run
(smdebug reads it at every step; trainprof only when its Profiler is made).

smdebug's side. torch is not installed, so `smdebug.pytorch.hook.Hook` cannot be made. What
its hooks do per step is reproduced here (class SmdebugTorchHookSteps), line for line, on
smdebug's own objects: the `ProfilerConfigParser` the module makes, the hook's
`TimelineFileWriter` and its writer thread, and the `error_handling_agent` decorator the hook
methods are wrapped in. Where smdebug would call torch (a window opened), the emulation
counts the step and reports it instead (it never happens with this config). The model is one
module without submodules (named "Net"), trained in mode TRAIN (`hook.set_mode(modes.TRAIN)`,
core/hook.py:set_mode). References are to the installed smdebug 1.0.34,
smdebug/<file>:<function>:

  setup (untimed)
    pytorch/hook.py:<module> (l.42-43)   get_profiler_config_parser(FRAMEWORK.PYTORCH) (reads the
                                         config), start_pre_step_zero_python_profiling() (cProfile
                                         runs until the first step)
    core/hook.py:BaseHook.__init__       profiler_config_parser.load_config();
                                         TimelineFileWriter(profiler_config_parser) (its thread starts);
                                         CallbackHook starts at step -1 (init_step=-1)
    core/hook.py:set_mode                mode = TRAIN, mode_steps[TRAIN] = -1
  per step, in the order PyTorch calls the hooks of the top module (pre-hook; then the forward
  hooks in registration order: fhook, then forward_hook, pytorch/hook.py:register_module):
    pytorch/hook.py:forward_pre_hook     (wrapped by error_handling_agent.catch_smdebug_errors)
      core/hook.py:_increment_step         step += 1; mode_steps[mode] += 1; mode_steps[GLOBAL] = step
      pytorch/hook.py:log_outstanding_timeline_metrics
        log_outstanding_forward_stats_and_reset: the submodule events but the last (none here),
          then log_trace_event(parent_forward_event) and log_trace_event(step_event) of the
          previous step, each -> core/hook.py:record_trace_events (wrapped by
          catch_smdebug_errors) -> core/tfevent/timeline_file_writer.py:write_trace_events
          (TimelineRecord, then Queue.put on a 100-entry queue: blocks while it is full);
          the writer thread (_TimelineLoggerThread.run/write_event) json.dumps, writes and
          flushes each event and stats the file for rotation, holding the GIL while in Python
        log_outstanding_backward_stats_and_reset: nothing to log (the backward hook is not
          registered in 1.0.34: register_module has it commented out), reset
      _TraceEventData("Step:ModeKeys.TRAIN", ...) and _TraceEventData("Forward", "Net", ...):
          time.time(), os.getpid(), str(mode step) each
      profiler/profiler_config_parser.py:load_config
          EVERY step: os.path.isfile, open, read, .lower(), json.loads of the whole file,
          compared with the last parsed dict; returns there while the file is unchanged (the
          rest, re-parsing the sub-configs and ConfigValidator, only runs when it changed)
      profiler_config_parser.py:handle_step_start_python_profiling -> _handle_step_python_profiling:
          is_python_profiling_enabled(); python_profiler.stop_profiling (returns: not
          profiling); should_save_metrics(PYTHON_PROFILING, step) -> can_start_profiling (False)
      should_save_metrics(DETAILED_PROFILING, step)        (False: the autograd profiler stays off)
      is_smdataparallel_profiling check; should_save_metrics(SMDATAPARALLEL_PROFILING, step) (False)
      first_forward_submodule_name = None
    pytorch/hook.py:fhook                (wrapped)
      handle_forward_pass_end_python_profiling -> _handle_step_python_profiling, as above
    pytorch/hook.py:forward_hook         (wrapped; registered on every module by module.apply,
                                         the top one included)
      time.time(); parent_forward_event / step_event end times; a Forward-SubModuleInternal
      _TraceEventData appended (written, if other modules followed, at the next pre-hook)
  close (untimed): core/hook.py:_cleanup's log_outstanding_timeline_metrics() (the last step's
  events) and timeline_writer.close().

Per step smdebug thus writes two events (Forward and Step:ModeKeys.TRAIN) and reads and parses
the config file once.

Left out of smdebug's side, each of which would only add to its time:
  * the debugger (tensor-saving) half of the same hooks, which trainprof does not replace:
    _close_writers / _close_tb_writer, prepared_collections, _increment_step's _write_state
    (state_store.is_checkpoint_updated: lists the checkpoint folder each step when SageMaker
    checkpointing is configured) and written_tensor_name_for_step.clear(),
    _get_collections_to_save_for_step (pre-hook and forward_hook), the default `losses`
    collection saved every 500 steps (FileWriter, _log_params), export_collections, and the
    per-parameter gradient hooks (backward_hook -> back) run during backward;
  * torch itself: the cost of calling Python hooks from Module.__call__ and of
    register_module; the autograd profiler, smdataparallel and dataloader paths (their windows
    are closed: should_save_metrics is evaluated, nothing else runs; should_save_dataloader_metrics
    is only called by AWS's patched DataLoader);
  * Forward-SubModuleInternal events: with submodules, smdebug writes one more event per
    submodule per step (forward_hook on each), trainprof none outside the detailed window;
  * the Horovod timeline reader (HvdTraceFileRotation: HOROVOD_TIMELINE is not set) and the
    post-close cProfile window Hook.close starts (it would profile trainprof's side).

trainprof's side, through the package as a trainer calls it, one call for each of smdebug's
per-step pieces (trainprof.torch makes the same calls, less active("smdataparallel") and,
outside the detailed window, the Forward event; it ends a step at the next step's begin):
    prof.step_begin("train")      step counting, the step-start Python-profiling boundary
    prof.active("detailed")       smdebug's should_save_metrics(DETAILED_PROFILING, step)
    prof.active("smdataparallel") smdebug's should_save_metrics(SMDATAPARALLEL_PROFILING, step)
    prof.now_us()                 the Forward event's start (smdebug: time.time())
    -- forward pass --
    prof.record_event("Forward", "Net", start, prof.now_us())   smdebug's Forward event;
                                  trainprof.torch only writes it in the detailed window
    prof.forward_end()            smdebug's fhook boundary
    prof.step_end()               the Step:ModeKeys.TRAIN event
trainprof has no per-step config read (it re-reads the file at most once a second, on its
own thread) and its events go to a lock-free queue drained by a Rust thread that never takes
the GIL.

Afterwards each side's timeline files (LocalPath/framework/pevents/<hour>/*.json) are read
and their Step:ModeKeys.TRAIN and Forward events counted against the steps run. Output: a
table, then `RESULT {json}` lines (one per percentile and phase).
"""

import atexit
import glob
import hashlib
import json
import os
import shutil
import sys
import tempfile
import time

from closed_windows import FAR, pct, write_config  # noqa: E402  (bench/)

N = int(os.environ.get("BENCH_STEPS", "20000"))
GAP_N = int(os.environ.get("BENCH_GAP_STEPS", "4000"))
GAP_US = int(os.environ.get("BENCH_GAP_US", "1000"))
WARMUP = int(os.environ.get("BENCH_WARMUP", "200"))
ROUNDS = int(os.environ.get("BENCH_ROUNDS", "4"))
BATCH = 100
PEER_NAME = "smdebug 1.0.34 hook (per-step work)"
STEP_PHASE = "Step:ModeKeys.TRAIN"
FORWARD_PHASE = "Forward"
MODULE = "Net"


# --------------------------------------------------------------------------------------
# Config and environment


def use_config(tmp, name):
    """Writes the SDK-shaped config with LocalPath <tmp>/<name>, points
    SMPROFILER_CONFIG_PATH at it, returns LocalPath."""
    path, root = write_config(tmp, name, FileOpenFailThreshold="50")
    os.environ["SMPROFILER_CONFIG_PATH"] = path
    return root


def clean_environment():
    """Nothing but the config file decides: no TRAINPROF_* override (the library path
    excepted), no SageMaker / MPI / Horovod variable that either parser reads."""
    for k in list(os.environ):
        if k.startswith("TRAINPROF_") and k != "TRAINPROF_HOOK_LIB":
            del os.environ[k]
    for k in ("SM_HPS", "SM_FRAMEWORK_PARAMS", "OMPI_COMM_WORLD_SIZE", "HOROVOD_TIMELINE"):
        os.environ.pop(k, None)
    # smdebug logs to stdout at INFO on config (re)loads; none happens per step.
    os.environ.setdefault("SMDEBUG_LOG_LEVEL", "warning")


# --------------------------------------------------------------------------------------
# smdebug 1.0.34: its PyTorch hook's per-step profiler work, without torch


def smdebug_side():
    from smdebug.core.modes import ModeKeys
    from smdebug.core.tfevent.timeline_file_writer import TimelineFileWriter
    from smdebug.core.utils import FRAMEWORK, error_handling_agent
    from smdebug.profiler.profiler_config_parser import MetricsCategory, get_profiler_config_parser

    # pytorch/hook.py, module level (l.42-43)
    profiler_config_parser = get_profiler_config_parser(FRAMEWORK.PYTORCH)
    profiler_config_parser.start_pre_step_zero_python_profiling()

    class _TraceEventData:
        """pytorch/hook.py:Hook._TraceEventData."""

        def __init__(self, phase, op_name, start_time, dur, **kwargs):
            self.training_phase = phase
            self.end_time = start_time + dur
            self.start_time = start_time
            self.op_name = op_name
            self.kwargs = kwargs

        def update_end_time(self, end_time=time.time()):
            self.end_time = end_time

    class SmdebugTorchHookSteps:
        """The profiler half of smdebug.pytorch.hook.Hook (see the module docstring)."""

        def __init__(self):
            # core/hook.py:BaseHook.__init__ (init_step=-1 from CallbackHook)
            self.step = -1
            self.mode = ModeKeys.GLOBAL
            self.mode_steps = {ModeKeys.GLOBAL: -1}
            self.profiler_config_parser = profiler_config_parser
            self.profiler_config_parser.load_config()
            self.timeline_writer = TimelineFileWriter(profiler_config_parser=profiler_config_parser)
            self.is_smdataparallel_profiling = False
            # pytorch/hook.py:Hook.__init__
            self.parent_forward_event = None
            self.parent_backward_event = None
            self.step_event = None
            self.forward_modules_profile_stats = []
            self.backward_modules_profile_stats = []
            self.first_forward_submodule_name = None
            self.autograd_profiler_enabled = False
            # core/hook.py:set_mode(ModeKeys.TRAIN)
            self.mode = ModeKeys.TRAIN
            self.mode_steps.setdefault(ModeKeys.TRAIN, -1)
            self.windows_opened = 0  # not smdebug's: steps where a window was found open

        # core/hook.py
        def _increment_step(self):
            self.step += 1
            self.mode_steps[self.mode] += 1
            if self.mode != ModeKeys.GLOBAL:
                self.mode_steps[ModeKeys.GLOBAL] = self.step

        @error_handling_agent.catch_smdebug_errors()
        def record_trace_events(self, timestamp, training_phase="", op_name="", phase="X", duration=1, **kwargs):
            self.timeline_writer.write_trace_events(
                training_phase=training_phase,
                op_name=op_name,
                phase=phase,
                timestamp=timestamp,
                duration=duration,
                **kwargs,
            )

        # pytorch/hook.py
        def log_trace_event(self, event):
            self.record_trace_events(
                training_phase=event.training_phase,
                op_name=event.op_name,
                phase="X",
                timestamp=event.start_time,
                duration=event.end_time - event.start_time,
                **(event.kwargs),
            )

        def reset_forward_module_profile_stats(self):
            self.parent_forward_event = None
            self.forward_modules_profile_stats = []

        def reset_backward_module_profile_stats(self):
            self.parent_backward_event = None
            self.backward_modules_profile_stats = []

        def log_outstanding_timeline_metrics(self):
            self.log_outstanding_forward_stats_and_reset()
            self.log_outstanding_backward_stats_and_reset()

        def log_outstanding_forward_stats_and_reset(self, log_step_event=True):
            for i in range(len(self.forward_modules_profile_stats) - 1):
                self.log_trace_event(self.forward_modules_profile_stats[i])
            if self.parent_forward_event:
                self.log_trace_event(self.parent_forward_event)
            if self.step_event and log_step_event is True:
                self.log_trace_event(self.step_event)
                self.step_event = None
            self.reset_forward_module_profile_stats()

        def log_outstanding_backward_stats_and_reset(self):
            for i in range(len(self.backward_modules_profile_stats)):
                self.log_trace_event(self.backward_modules_profile_stats[i])
            if self.parent_backward_event:
                self.log_trace_event(self.parent_backward_event)
            self.reset_backward_module_profile_stats()

        @error_handling_agent.catch_smdebug_errors()
        def forward_pre_hook(self, module_name):
            self._increment_step()
            self.log_outstanding_timeline_metrics()
            self.step_event = _TraceEventData(
                phase="Step:" + str(self.mode),
                op_name="Step:" + str(self.mode),
                start_time=time.time(),
                dur=0,
                pid=os.getpid(),
                step_num=str(self.mode_steps[self.mode]),
            )
            self.parent_forward_event = _TraceEventData(
                phase="Forward",
                op_name=module_name,
                start_time=time.time(),
                dur=0,
                pid=os.getpid(),
                step_num=str(self.mode_steps[self.mode]),
            )
            self.profiler_config_parser.load_config()
            self.profiler_config_parser.handle_step_start_python_profiling(self.mode, self.step)
            # Below, where smdebug would call torch or smdataparallel (a window opened), the
            # emulation only notes that the run left the steady state.
            if self.autograd_profiler_enabled and not self.profiler_config_parser.config.detailed_profiling_config.disabled:
                self.windows_opened += 1
            if (
                self.profiler_config_parser.should_save_metrics(MetricsCategory.DETAILED_PROFILING, self.step)
                and not self.autograd_profiler_enabled
            ):
                self.windows_opened += 1
            if self.is_smdataparallel_profiling:
                self.windows_opened += 1
            self.is_smdataparallel_profiling = False
            if self.profiler_config_parser.should_save_metrics(MetricsCategory.SMDATAPARALLEL_PROFILING, self.step):
                self.windows_opened += 1
            self.first_forward_submodule_name = None

        @error_handling_agent.catch_smdebug_errors()
        def fhook(self):
            self.profiler_config_parser.handle_forward_pass_end_python_profiling(self.mode, self.step)

        @error_handling_agent.catch_smdebug_errors()
        def forward_hook(self, module_name):
            cur_time = time.time()
            child_start_time = cur_time
            if self.parent_forward_event is not None:
                self.parent_forward_event.update_end_time(cur_time)
                child_start_time = self.parent_forward_event.start_time
            if self.step_event:
                self.step_event.update_end_time(cur_time)
            if len(self.forward_modules_profile_stats) > 0:
                child_start_time = self.forward_modules_profile_stats[-1].end_time
            event = _TraceEventData(
                phase="Forward-SubModuleInternal",
                op_name=module_name,
                start_time=child_start_time,
                dur=cur_time - child_start_time,
                pid=os.getpid(),
                step_num=str(self.mode_steps[self.mode]),
            )
            self.forward_modules_profile_stats.append(event)
            if len(self.forward_modules_profile_stats) == 1:
                self.first_forward_submodule_name = module_name

        def close(self):
            # core/hook.py:_cleanup, its timeline part
            self.log_outstanding_timeline_metrics()
            self.timeline_writer.close()

    hook = SmdebugTorchHookSteps()

    def begin():
        hook.forward_pre_hook(MODULE)

    def end():
        hook.fhook()
        hook.forward_hook(MODULE)

    def extra():
        if hook.windows_opened:
            return "NOT the steady state: a window opened at %d step(s)" % hook.windows_opened
        return ""

    return begin, end, hook.close, extra


# --------------------------------------------------------------------------------------
# trainprof


def trainprof_side():
    import trainprof

    prof = trainprof.Profiler(framework="pytorch")
    if not prof.enabled:
        raise SystemExit("trainprof: the profiler is not enabled (init status %s)" % prof.init_status)
    state = [0, 0]  # the Forward event's start; steps where a window was found open

    def begin():
        prof.step_begin("train")
        if prof.active("detailed"):
            state[1] += 1
        if prof.active("smdataparallel"):
            state[1] += 1
        state[0] = prof.now_us()

    def end():
        start = state[0]
        prof.record_event(FORWARD_PHASE, MODULE, start, prof.now_us())
        prof.forward_end()
        prof.step_end()

    def extra():
        s = prof.stats()
        out = "dropped %d" % prof.dropped if s is None else "dropped (queue full) %d" % s["dropped_queue_full"]
        if state[1]:
            out += "; NOT the steady state: a window opened at %d step(s)" % state[1]
        return out

    return begin, end, prof.close, extra


# --------------------------------------------------------------------------------------
# Measurement


def back_to_back(begin, end, n):
    """µs per step of each batch of BATCH steps run back to back."""
    clock = time.perf_counter_ns
    out = []
    for _ in range(n // BATCH):
        t0 = clock()
        for _ in range(BATCH):
            begin()
            end()
        out.append((clock() - t0) / BATCH / 1000.0)
    return out


def gil_free_work(us):
    """A callable that keeps this core busy for about ``us`` µs with the GIL released
    (hashlib hashes a buffer over 2 KiB without the GIL): the stand-in for a forward pass
    inside torch. Calibrated here; the time it really took is measured and reported."""
    clock = time.perf_counter_ns
    probe = memoryview(bytes(1 << 20))
    best = None
    for _ in range(10):  # the fastest of 10: what the core does when nothing else runs
        t0 = clock()
        hashlib.sha256(probe).digest()
        t = clock() - t0
        best = t if best is None else min(best, t)
    ns_per_byte = best / len(probe)
    work = memoryview(bytes(max(4096, int(us * 1000 / ns_per_byte))))
    return lambda: hashlib.sha256(work).digest()


def with_gap(begin, end, n, forward):
    """µs per step in the hook calls only, around a GIL-free ``forward`` in each step; and
    the mean µs the forwards took."""
    clock = time.perf_counter_ns
    out = []
    in_forward = 0
    for _ in range(n // BATCH):
        spent = 0
        for _ in range(BATCH):
            t0 = clock()
            begin()
            t1 = clock()
            forward()
            t2 = clock()
            end()
            spent += t1 - t0 + clock() - t2
            in_forward += t2 - t1
        out.append(spent / BATCH / 1000.0)
    return out, in_forward / max(1, n // BATCH * BATCH) / 1000.0


def warm(begin, end, n):
    for _ in range(n):
        begin()
        end()


def count_events(root):
    """{training phase: complete events} over the sealed timeline files under root."""
    counts = {}
    files = glob.glob(os.path.join(root, "framework", "pevents", "*", "*.json"))
    for path in files:
        with open(path) as f:
            events = json.load(f)
        phase_of = {}
        for e in events:
            if e.get("ph") == "M" and e.get("name") == "process_name" and "name" in e.get("args", {}):
                phase_of[e["pid"]] = e["args"]["name"]
        for e in events:
            if e.get("ph") == "X":
                p = phase_of.get(e.get("pid"), "?")
                counts[p] = counts.get(p, 0) + 1
    return counts, len(files)


class Side:
    """One side's hooks and what was measured of them."""

    def __init__(self, label, make, root):
        self.label = label
        self.root = root
        self.begin, self.end, self._close, self._extra = make()
        self.steps = 0
        self.tight = []
        self.gap = []
        self.forward_us = []

    def warm(self, n):
        warm(self.begin, self.end, n)
        self.steps += n

    def round(self, tight_n, gap_n, forward):
        self.warm(WARMUP)
        self.tight += back_to_back(self.begin, self.end, tight_n)
        self.steps += tight_n // BATCH * BATCH
        self.warm(WARMUP)
        batches, forward_us = with_gap(self.begin, self.end, gap_n, forward)
        self.gap += batches
        self.forward_us.append(forward_us)
        self.steps += gap_n // BATCH * BATCH

    def close(self):
        t0 = time.perf_counter()
        self._close()
        self.close_s = time.perf_counter() - t0
        self.counts, self.files = count_events(self.root)
        self.extra = self._extra()


def main():
    clean_environment()
    tmp = tempfile.mkdtemp(prefix="trainprof-stepbench-")
    if tmp != tmp.lower():  # smdebug lowercases the whole config file, LocalPath included
        shutil.rmtree(tmp, ignore_errors=True)
        tmp = tempfile.mkdtemp(prefix="trainprof-stepbench-")
    # Removed at exit, after trainprof's own exit handler (registered later, so run earlier)
    # has written the post-close Python-profiling window's stats under LocalPath.
    atexit.register(shutil.rmtree, tmp, ignore_errors=True)
    forward = gil_free_work(GAP_US)
    # Each side is made, and run past its first step, under its own config; smdebug reads
    # SMPROFILER_CONFIG_PATH at every step, trainprof only when it is made.
    sm_config = os.path.join(tmp, "smdebug.json")
    sm = Side("smdebug", smdebug_side, use_config(tmp, "smdebug"))
    sm.warm(WARMUP)
    tp = Side("trainprof", trainprof_side, use_config(tmp, "trainprof"))
    tp.warm(WARMUP)
    os.environ["SMPROFILER_CONFIG_PATH"] = sm_config
    # Rounds, the sides alternating (and which goes first), so that what else the
    # machine does at the time is shared between them.
    for r in range(ROUNDS):
        for side in (sm, tp) if r % 2 == 0 else (tp, sm):
            side.round(N // ROUNDS, GAP_N // ROUNDS, forward)
    sm.close()
    tp.close()

    tight_n = N // ROUNDS // BATCH * BATCH * ROUNDS
    gap_n = GAP_N // ROUNDS // BATCH * BATCH * ROUNDS
    print("per-step cost on the training thread, µs per step: p50 / p90 / p99 of batches of %d steps" % BATCH)
    print(
        "model: 1 module, mode train; every window configured, all closed; %d rounds, sides alternating, "
        "%d warm-up steps before each phase" % (ROUNDS, WARMUP)
    )
    phases = [
        ("tight", "back to back, %d steps" % tight_n, "µs per step from Python"),
        (
            "gap",
            "~%d µs GIL-free forward, %d steps" % (GAP_US, gap_n),
            "µs per step from Python, %d µs GIL-free forward" % GAP_US,
        ),
    ]
    print("%-38s %-10s %8s %8s %8s" % ("phase", "side", "p50", "p90", "p99"))
    results = []
    for key, title, metric in phases:
        for side in (tp, sm):
            v = getattr(side, key)
            print("%-38s %-10s %8.2f %8.2f %8.2f" % (title, side.label, pct(v, 0.5), pct(v, 0.9), pct(v, 0.99)))
            title = ""
        for q, qn in ((0.5, "p50"), (0.99, "p99")):
            a, b = pct(getattr(tp, key), q), pct(getattr(sm, key), q)
            print("%-38s %-10s smdebug / trainprof at %s: %.1fx" % ("", "ratio", qn, b / a if a > 0 else float("inf")))
            results.append(
                {
                    "metric": "%s (%s)" % (metric, qn),
                    "unit": "µs",
                    "trainprof": round(a, 2),
                    "peer": round(b, 2),
                    "peer_name": PEER_NAME,
                    "better": "lower",
                }
            )
    print()
    for key, title, _ in phases:
        for side in (tp, sm):
            v = getattr(side, key)
            per = len(v) // ROUNDS
            rounds = " ".join("%.1f" % pct(v[i * per : (i + 1) * per], 0.5) for i in range(ROUNDS))
            print("p50 per round, %-9s %-10s %s" % (key, side.label, rounds))
    print(
        "the GIL-free forward (sha256 of a buffer) took %.0f µs on average (trainprof's steps), %.0f µs (smdebug's)"
        % (sum(tp.forward_us) / len(tp.forward_us), sum(sm.forward_us) / len(sm.forward_us))
    )
    print()
    for side in (tp, sm):
        c = side.counts
        others = {k: n for k, n in c.items() if k not in (STEP_PHASE, FORWARD_PHASE)}
        print(
            "%-10s events in %d file(s): %s %d of %d, %s %d of %d%s; close %.2f s%s"
            % (
                side.label,
                side.files,
                STEP_PHASE,
                c.get(STEP_PHASE, 0),
                side.steps,
                FORWARD_PHASE,
                c.get(FORWARD_PHASE, 0),
                side.steps,
                "; other: %s" % json.dumps(others, sort_keys=True) if others else "",
                side.close_s,
                "; " + side.extra if side.extra else "",
            )
        )
    print()
    for r in results:
        print("RESULT " + json.dumps(r, ensure_ascii=False))
    return 0


if __name__ == "__main__":
    sys.exit(main())
