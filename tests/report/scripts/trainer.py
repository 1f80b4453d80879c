"""A trainer with known answers for the report tests (tests/report), through the real
trainprof package and hook.

TRAINPROF_TEST_PARAMS (JSON):
  steps         train steps (default 20)
  step_ms       each step sleeps this long (default 5)
  slow          {"<step>": ms}: these steps sleep this long instead
  slow_factor   every step's sleep is multiplied by this (a slowed rank)
  burn_procs    processes burning CPU for the whole run (default 0)
  burn_s        how long the burners run before the steps start (default 0)
  dataloader    record a DataLoaderIter event in each step whose dataloader window is open
                (and a DataLoaderIterInitialize event before the first)
Everything recorded goes into the JSON manifest at TRAINPROF_TEST_MANIFEST.
"""

import json
import multiprocessing
import os
import time

import trainprof

PARAMS = json.loads(os.environ.get("TRAINPROF_TEST_PARAMS") or "{}")
STEPS = PARAMS.get("steps", 20)
STEP_MS = PARAMS.get("step_ms", 5)
SLOW = {int(k): v for k, v in PARAMS.get("slow", {}).items()}
FACTOR = PARAMS.get("slow_factor", 1.0)
DATALOADER_NAME = "_SingleProcessDataLoaderIter.DataLoaderIter::GetNext"


def burn(seconds):
    end = time.monotonic() + seconds
    n = 0
    while time.monotonic() < end:
        n += 1


def tp_report_known_function(ms):
    time.sleep(ms / 1000.0)


def main():
    burners = []
    for _ in range(PARAMS.get("burn_procs", 0)):
        p = multiprocessing.Process(target=burn, args=(PARAMS.get("burn_s", 0) + 60,))
        p.start()
        burners.append(p)
    prof = trainprof.Profiler(framework="pytorch")
    manifest = {"node_id": prof.node_id, "steps": [], "dataloader_steps": []}
    if burners:
        time.sleep(PARAMS.get("burn_s", 0))
    for _ in range(STEPS):
        step = prof.step_begin("train")
        start = time.time()
        if PARAMS.get("dataloader") and prof.active("dataloader", DATALOADER_NAME):
            if not manifest["dataloader_steps"]:
                init_args = {"num_workers": 0, "pin_memory": False}
                with prof.record("DataLoaderIterInitialize", "_SingleProcessDataLoaderIter.__init__", args=init_args):
                    pass
            with prof.record("DataLoaderIter", DATALOADER_NAME, args={"worker_id": 0}):
                time.sleep(0.002)
            manifest["dataloader_steps"].append(step)
        tp_report_known_function(SLOW.get(step, STEP_MS) * FACTOR)
        prof.step_end()
        manifest["steps"].append({"step": step, "start": start, "ms": (time.time() - start) * 1000})
    for p in burners:
        p.terminate()
        p.join()
    prof.close()
    with open(os.environ["TRAINPROF_TEST_MANIFEST"], "w") as f:
        json.dump(manifest, f)


if __name__ == "__main__":
    main()
