"""The watchdog's cost (HangDetectionConfig; docs/formats.md, "Hang and crash dumps"): a
5 ms step loop through the trainprof package with hang detection off and on, side by side,
each in its own process (one hook per process), alternating, several rounds.

Two numbers per side:

* ``step_ms``: the mean wall time of a train step whose body is a fixed 5 ms of CPU work
  (a calibrated busy loop, so the number moves with anything that slows the trainer's
  thread: the ring entries at step begin and end, the watchdog waking once a second);
* ``calls_us``: the mean cost of one ``step_begin`` + ``step_end`` pair with an empty body.

    TRAINPROF_HOOK_LIB=target/release/libtrainprof_hook.so PYTHONPATH=hook-ffi/python \\
        python bench/hang_watchdog.py [--steps 2000] [--rounds 5]
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

CHILD = r"""
import json, os, sys, time
import trainprof

steps = int(sys.argv[1])
prof = trainprof.Profiler(framework="pytorch")

def spin(s):
    end = time.perf_counter() + s
    while time.perf_counter() < end:
        pass

for _ in range(50):  # warm up
    prof.step_begin("train"); spin(0.005); prof.step_end()
t0 = time.perf_counter()
for _ in range(steps):
    prof.step_begin("train")
    spin(0.005)
    prof.step_end()
step_ms = (time.perf_counter() - t0) / steps * 1e3
n = 20000
t0 = time.perf_counter()
for _ in range(n):
    prof.step_begin("train")
    prof.step_end()
calls_us = (time.perf_counter() - t0) / n * 1e6
prof.close()
print(json.dumps({"step_ms": step_ms, "calls_us": calls_us}))
"""


def run(tmp, name, hang, steps):
    root = os.path.join(tmp, name)
    params = {"LocalPath": root}
    if hang:
        params["HangDetectionConfig"] = json.dumps({"HangTimeoutS": 300, "HangFactor": 10})
    path = os.path.join(tmp, name + ".json")
    with open(path, "w") as f:
        json.dump({"ProfilingParameters": params}, f)
    env = dict(os.environ, SMPROFILER_CONFIG_PATH=path)
    out = subprocess.run(
        [sys.executable, "-c", CHILD, str(steps)], env=env, capture_output=True, text=True, check=True
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=2000)
    ap.add_argument("--rounds", type=int, default=5)
    a = ap.parse_args()
    res = {False: [], True: []}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(a.rounds):
            for hang in (False, True) if r % 2 == 0 else (True, False):
                res[hang].append(run(tmp, "r%d-%s" % (r, "on" if hang else "off"), hang, a.steps))
    for key, unit in (("step_ms", "ms"), ("calls_us", "µs")):
        off = statistics.median(x[key] for x in res[False])
        on = statistics.median(x[key] for x in res[True])
        print("%-9s off %.4f %s  on %.4f %s  (%+.2f %%)" % (key, off, unit, on, unit, (on - off) / off * 100))


if __name__ == "__main__":
    main()
