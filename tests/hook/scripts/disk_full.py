"""Records events while the test fills the disk under LocalPath and frees it again, for
test_disk_full.py. The steps are handed over through files in TRAINPROF_TEST_PARAMS["sync"]
(outside the full disk): ``fill`` (the first events are written) -> ``filled`` -> ``free``
(the writer has met the full disk) -> ``freed``. Phases: ``Before`` (recorded and written
before the disk filled), ``During`` (while it is full), ``After`` (once it is freed)."""

import json
import os
import sys
import time

import trainprof

PARAMS = json.loads(os.environ["TRAINPROF_TEST_PARAMS"])
SYNC = PARAMS["sync"]
BEFORE = PARAMS.get("before", 2000)
AFTER = PARAMS.get("after", 50)


def until(cond, what):
    """Waits for cond(); a guard against hanging, not a measurement."""
    deadline = time.monotonic() + 60
    while not cond():
        if time.monotonic() > deadline:
            sys.exit("gave up waiting for " + what)
        time.sleep(0.002)


def signal(name):
    open(os.path.join(SYNC, name), "w").close()


def wait_for(name):
    until(lambda: os.path.exists(os.path.join(SYNC, name)), name)


prof = trainprof.Profiler(framework="pytorch", strict=True)
t0 = prof.now_us()
recorded = {"Before": 0, "During": 0, "After": 0}


def record(phase):
    i = recorded[phase]
    prof.record_event(phase, "e", t0 + i, t0 + i + 1, step=i)
    recorded[phase] += 1


for _ in range(BEFORE):
    record("Before")
until(lambda: prof.stats()["written"] >= BEFORE, "the first events written")
signal("fill")
wait_for("filled")
while prof.stats()["dropped_writer"] == 0:
    record("During")
    time.sleep(0.001)
signal("free")
wait_for("freed")
written = prof.stats()["written"]
while prof.stats()["written"] < written + AFTER:
    record("After")
    time.sleep(0.001)
prof.close()
with open(os.environ["TRAINPROF_TEST_MANIFEST"], "w") as f:
    json.dump({"recorded": recorded, "stats": prof.stats(), "dropped": prof.dropped}, f)
