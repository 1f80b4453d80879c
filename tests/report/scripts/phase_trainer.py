"""A trainer with phases in every step, for `trainprof compare` (tests/report/test_compare.py),
through the real trainprof package and hook.

TRAINPROF_TEST_PARAMS (JSON):
  steps     train steps (default 100)
  phases    [[phase, ms], ...]: each step records these phases in turn, each sleeping its ms
            (default: DataLoaderIter 2, Compute 30, AllReduce 2)
  slow      {"<phase>": factor}: these phases sleep factor × their ms (the planted change)
  ranks     start this many ranks (RANK 0..n-1, one process each) and wait for them
Everything measured goes into the JSON manifest at TRAINPROF_TEST_MANIFEST (.<rank> with ranks).
"""

import json
import os
import subprocess
import sys
import time

import trainprof

PARAMS = json.loads(os.environ.get("TRAINPROF_TEST_PARAMS") or "{}")
STEPS = PARAMS.get("steps", 100)
PHASES = PARAMS.get("phases", [["DataLoaderIter", 2], ["Compute", 30], ["AllReduce", 2]])
SLOW = PARAMS.get("slow", {})


def launch(n):
    procs = []
    for rank in range(n):
        env = dict(os.environ)
        env["RANK"] = str(rank)
        env["TRAINPROF_TEST_PARAMS"] = json.dumps({k: v for k, v in PARAMS.items() if k != "ranks"})
        env["TRAINPROF_TEST_MANIFEST"] = os.environ["TRAINPROF_TEST_MANIFEST"] + ".%d" % rank
        procs.append(subprocess.Popen([sys.executable, os.path.abspath(__file__)], env=env))
    return max(p.wait() for p in procs)


def main():
    if PARAMS.get("ranks"):
        return launch(PARAMS["ranks"])
    prof = trainprof.Profiler(framework="pytorch")
    manifest = {"node_id": prof.node_id, "steps": []}
    for _ in range(STEPS):
        step = prof.step_begin("train")
        start = time.perf_counter()
        for phase, ms in PHASES:
            with prof.record(phase, "model." + phase.lower()):
                time.sleep(ms * SLOW.get(phase, 1.0) / 1000.0)
        prof.step_end()
        manifest["steps"].append({"step": step, "ms": (time.perf_counter() - start) * 1000})
    prof.close()
    with open(os.environ["TRAINPROF_TEST_MANIFEST"], "w") as f:
        json.dump(manifest, f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
