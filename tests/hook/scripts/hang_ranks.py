"""Two ranks of a toy data-parallel job, for tests/hook/test_hangs.py (and a report's "Hangs
and crashes" across ranks): a FIFO from rank 1 to rank 0 stands in for a collective. Every step
rank 1 sends one byte as it begins and rank 0 waits for it inside its own step (the
"all_reduce"). In step 30 rank 1 stops stepping: it blocks on a ``threading.Lock`` for
``release_s``; rank 0 completes step 30 and then waits in step 31, blocked in ``read`` on the
FIFO: rank 1 is the one behind (the lowest last begun step, 30 against 31). After the release
(``release_s``, and once both ranks' dumps are there) both finish their 40 steps and exit 0.

TRAINPROF_TEST_PARAMS: ``{"fifo": path, "release_s": float}``; the rank is ``$RANK``."""

import json
import os
import threading
import time

import trainprof
import waits

PARAMS = json.loads(os.environ.get("TRAINPROF_TEST_PARAMS") or "{}")
RANK = int(os.environ["RANK"])
RELEASE_S = float(PARAMS.get("release_s", 3.0))

fd = os.open(PARAMS["fifo"], os.O_RDONLY if RANK == 0 else os.O_WRONLY)
lock = threading.Lock()
prof = trainprof.Profiler(framework="pytorch")
for step in range(40):
    prof.step_begin("train")
    with prof.record("Forward", "Net"):
        time.sleep(0.005)
    if RANK == 1:
        os.write(fd, b"x")
        if step == 30:
            lock.acquire()
            lock.acquire(timeout=RELEASE_S)  # rank 1 stops stepping
            waits.wait_for_dumps(2)  # until both ranks' watchdogs have dumped
    else:
        with prof.record("AllReduce", "Collective"):
            os.read(fd, 1)  # rank 0 waits for rank 1
    prof.step_end()
prof.close()
print("done", flush=True)
