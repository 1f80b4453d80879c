"""Train steps of a set length (time.sleep) through the trainprof package, for the
anomaly-triggered window tests: run in a subprocess by tests/hook/test_auto_profiling.py.

TRAINPROF_TEST_PARAMS (JSON): ``steps`` (train steps), ``step_ms`` (every step's length),
``slow`` ({step: ms}: the steps that take longer), ``framework``, ``close_ms`` (the cost of
closing a detailed window, spent where the torch adapter spends it: right after the
``step_begin`` of the first step the window no longer covers). The manifest
(TRAINPROF_TEST_MANIFEST) lists, per step, whether the detailed window was open and
whether a Python profiler ran during the step.
"""

import json
import os
import sys
import time

import trainprof

PARAMS = json.loads(os.environ.get("TRAINPROF_TEST_PARAMS") or "{}")
MANIFEST = os.environ["TRAINPROF_TEST_MANIFEST"]
FRAMEWORK = PARAMS.get("framework", "pytorch")
STEPS = PARAMS.get("steps", 40)
STEP_MS = PARAMS.get("step_ms", 20)
SLOW = {int(k): v for k, v in PARAMS.get("slow", {}).items()}
CLOSE_MS = PARAMS.get("close_ms", 0)


def profiler_running():
    """Is a profiler (cProfile, pyinstrument) hooked into this thread?"""
    mon = getattr(sys, "monitoring", None)  # Python 3.12+: cProfile uses sys.monitoring
    if mon is not None and mon.get_tool(mon.PROFILER_ID) is not None:
        return True
    return sys.getprofile() is not None


def tp_step_work(ms):
    time.sleep(ms / 1000.0)


prof = trainprof.Profiler(framework=FRAMEWORK)
manifest = {"init_status": prof.init_status, "pid": os.getpid(), "steps": []}
was_detailed = False
for _ in range(STEPS):
    step = prof.step_begin("train")
    detailed = prof.active("detailed")
    if was_detailed and not detailed:
        time.sleep(CLOSE_MS / 1000.0)  # torch.profiler's stop and event processing
    was_detailed = detailed
    python = profiler_running()
    tp_step_work(SLOW.get(step, STEP_MS))
    if FRAMEWORK == "pytorch":
        prof.forward_end()
    prof.step_end()
    manifest["steps"].append({"step": step, "detailed": detailed, "python": python})
prof.close()
manifest["stats"] = prof.stats()
with open(MANIFEST, "w") as f:
    json.dump(manifest, f)
