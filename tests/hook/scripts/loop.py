"""A small training loop through the trainprof package, run in a subprocess by the tests.

TRAINPROF_TEST_PARAMS (JSON) says what to do; everything the loop recorded and every
answer it got goes into the JSON manifest at TRAINPROF_TEST_MANIFEST, which the test
compares with what smdebug reads back.

The tp_*_work functions mark where in the loop Python time is spent, so that the tests
can check which Python-profiling window saw which function.
"""

import ctypes
import json
import os
import sys
import time

import trainprof

PARAMS = json.loads(os.environ.get("TRAINPROF_TEST_PARAMS") or "{}")
MANIFEST = os.environ["TRAINPROF_TEST_MANIFEST"]
FRAMEWORK = PARAMS.get("framework", "pytorch")
PHASES = PARAMS.get("phases", [["train", 6], ["eval", 3]])
EVENTS = PARAMS.get("events", True)
WORK_MS = PARAMS.get("work_ms", 1.0)
FORK_AT = PARAMS.get("fork_at")  # [mode, step] or None
# Steps whose forward pass takes longer: heavy_work_ms busy and heavy_sleep_ms asleep.
HEAVY_STEPS = set(PARAMS.get("heavy_steps", []))
HEAVY_WORK_MS = PARAMS.get("heavy_work_ms", 0)
HEAVY_SLEEP_MS = PARAMS.get("heavy_sleep_ms", 0)
FEATURES = ("detailed", "python", "smdataparallel")
DATALOADER_NAME = "_SingleProcessDataLoaderIter.DataLoaderIter::GetNext"


def busy(ms):
    end = time.perf_counter() + ms / 1000.0
    n = 0
    while time.perf_counter() < end:
        n += 1
    return n


def tp_setup_work():
    return busy(WORK_MS)


def tp_forward_work(ms=None):
    return busy(WORK_MS if ms is None else ms)


def tp_heavy_work(ms):
    """Busy for ``ms`` of CPU time (not wall time: the machine may be loaded)."""
    end = time.process_time() + ms / 1000.0
    n = 0
    while time.process_time() < end:
        n += 1
    return n


def tp_forward_sleep(ms):
    time.sleep(ms / 1000.0)


def timed(fn, *args):
    """Runs fn; returns (wall, cpu) seconds as the cProfile timers see them (os.times)."""
    t0 = os.times()
    fn(*args)
    t1 = os.times()
    cpu = (t1.user + t1.system) - (t0.user + t0.system)
    return {"wall": t1.elapsed - t0.elapsed, "cpu": cpu}


def tp_backward_work():
    return busy(WORK_MS)


def tp_between_steps_work():
    return busy(WORK_MS)


def tp_teardown_work():
    return busy(WORK_MS)


def profiler_running():
    """Is a profiler (cProfile, pyinstrument) hooked into this thread?"""
    mon = getattr(sys, "monitoring", None)  # Python 3.12+: cProfile uses sys.monitoring
    if mon is not None and mon.get_tool(mon.PROFILER_ID) is not None:
        return True
    return sys.getprofile() is not None


manifest = {
    "pid": os.getpid(),
    "framework": FRAMEWORK,
    "events": [],
    "steps": [],
    "active": [],
}


def note(phase, name, step, args=None):
    manifest["events"].append({"phase": phase, "name": name, "step": step, "args": args or {}})


def forked_child(prof):
    """In a fork()ed child: every package call is a no-op, every library call FORKED_CHILD."""
    r = {"pid": os.getpid(), "profiler_running": profiler_running()}
    r["step_begin"] = prof.step_begin("train")
    with prof.record("Forward", "ChildNet", args={"worker_id": 99}):
        busy(1)
    prof.record_event("Forward", "ChildNet", 1, 2, step=5)
    r["forward_end"] = prof.forward_end()
    r["active"] = [prof.active(f) for f in FEATURES] + [prof.active("dataloader", DATALOADER_NAME)]
    r["step_end"] = prof.step_end()
    r["stats"] = prof.stats()
    r["node_id"] = prof.node_id
    r["close"] = prof.close()
    lib = prof._lib
    w = trainprof._lib.TrainprofPythonWindow()
    step, w2, detailed = ctypes.c_int64(77), trainprof._lib.TrainprofPythonWindow(started=77), ctypes.c_int32(77)
    r["lib"] = {
        "step_begin": lib.trainprof_step_begin(1, -1, None),
        "record": lib.trainprof_record(0, 0, 1, 2, -1, None, 0),
        "python_boundary": lib.trainprof_python_boundary(2, ctypes.byref(w)),
        "python_boundary_ended": w.ended,
        "python_boundary_started": w.started,
        "step_next": [lib.trainprof_step_next(1, -1, ctypes.byref(step), ctypes.byref(w2), ctypes.byref(detailed))]
        + [step.value, w2.started, detailed.value],
        "shutdown": lib.trainprof_shutdown(10),
        "init": lib.trainprof_init(b"pytorch"),
    }
    with open(MANIFEST + ".child.json", "w") as f:
        json.dump(r, f)


prof = trainprof.Profiler(framework=FRAMEWORK)
manifest["init_status"] = prof.init_status
manifest["node_id"] = prof.node_id
tp_setup_work()

for mode, count in PHASES:
    step_phase = "Step:ModeKeys." + mode.upper()
    for _ in range(count):
        step = prof.step_begin(mode)
        manifest["steps"].append([mode, step])
        answers = {"mode": mode, "step": step, "global": len(manifest["steps"]) - 1}
        for feature in FEATURES:
            answers[feature] = prof.active(feature)
        answers["dataloader"] = prof.active("dataloader", DATALOADER_NAME)
        answers["dataloader_other"] = prof.active("dataloader", "TFDataset::Prefetch")
        manifest["active"].append(answers)

        if FORK_AT is not None and [mode, step] == FORK_AT:
            manifest["parent_profiler_running_at_fork"] = profiler_running()
            child = os.fork()
            if child == 0:
                try:
                    forked_child(prof)
                finally:
                    os._exit(0)
            _, status = os.waitpid(child, 0)
            manifest["child_exit_status"] = status

        if EVENTS:
            args = {"worker_id": step % 4, "pin_memory": True, "ratio": 0.5}
            with prof.record("DataLoaderIter", DATALOADER_NAME, args=args):
                busy(0.05)
            note("DataLoaderIter", DATALOADER_NAME, step, args)
        if EVENTS:
            with prof.record("Forward", "Net"):
                tp_forward_work()
            note("Forward", "Net", step)
        else:
            tp_forward_work()
        if step in HEAVY_STEPS:
            manifest.setdefault("heavy", {})[str(step)] = {
                "work": timed(tp_heavy_work, HEAVY_WORK_MS),
                "sleep": timed(tp_forward_sleep, HEAVY_SLEEP_MS),
            }
        if FRAMEWORK == "pytorch":
            prof.forward_end()
        if EVENTS and mode == "train":
            t0 = prof.now_us()
            tp_backward_work()
            prof.record_event("DataLoaderWorker", "worker", t0, prof.now_us(), step=100 + step, args={"worker_id": 3})
            note("DataLoaderWorker", "worker", 100 + step, {"worker_id": 3})
        else:
            tp_backward_work()
        prof.step_end()
        note(step_phase, step_phase, step)
        tp_between_steps_work()

if PARAMS.get("close", True):
    prof.close()
manifest["stats"] = prof.stats()
manifest["dropped"] = prof.dropped
# Anything still temporary right after close(): the timelines must all be sealed.
manifest["tmp_after_close"] = []
if os.path.isdir(PARAMS.get("local_path", "out")):
    for dirpath, dirnames, filenames in os.walk(PARAMS.get("local_path", "out")):
        for n in dirnames + filenames:
            if n.endswith(".tmp"):
                manifest["tmp_after_close"].append(os.path.join(dirpath, n))
# After close: recording is refused, windows answer False.
with prof.record("Forward", "AfterClose"):
    pass
manifest["active_after_close"] = prof.active("python")
tp_teardown_work()

with open(MANIFEST, "w") as f:
    json.dump(manifest, f)
