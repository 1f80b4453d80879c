"""The watchdog's cost (HangDetectionConfig; docs/formats.md, "Hang and crash dumps"): a
5 ms step loop through the trainprof package with hang detection off and on, side by side,
each in its own process (one hook per process), alternating, several rounds; medians.

Per side:

* ``step_cpu_ms``: the trainer thread's CPU time per train step (``time.thread_time``), the
  step's body being a busy loop until that thread has used 5 ms of CPU. What the trainer's
  thread does for the feature (the ring entries at step begin and end) adds to it; a busy
  machine's preemption does not (the clock is the thread's own);
* ``step_wall_ms``: the same steps by the wall clock (moves with the machine's load too, and
  with the watchdog's once-a-second wake-up taking a core);
* ``calls_us``: one ``step_begin`` + ``step_end`` pair with an empty body, by thread CPU time.

    TRAINPROF_HOOK_LIB=target/debug/libtrainprof_hook.so PYTHONPATH=hook-ffi/python \\
        python bench/hang_watchdog.py [--steps 1000] [--rounds 6]
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
import json, sys, time
import trainprof

steps = int(sys.argv[1])
prof = trainprof.Profiler(framework="pytorch")
cpu = time.thread_time


def spin(s):
    end = cpu() + s
    while cpu() < end:
        pass


for _ in range(50):  # warm up
    prof.step_begin("train"); spin(0.005); prof.step_end()
c0, w0 = cpu(), time.perf_counter()
for _ in range(steps):
    prof.step_begin("train")
    spin(0.005)
    prof.step_end()
step_cpu_ms = (cpu() - c0) / steps * 1e3
step_wall_ms = (time.perf_counter() - w0) / steps * 1e3
n = 20000
c0 = cpu()
for _ in range(n):
    prof.step_begin("train")
    prof.step_end()
calls_us = (cpu() - c0) / n * 1e6
prof.close()
print(json.dumps({"step_cpu_ms": step_cpu_ms, "step_wall_ms": step_wall_ms, "calls_us": calls_us}))
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
    ap.add_argument("--steps", type=int, default=1000)
    ap.add_argument("--rounds", type=int, default=6)
    a = ap.parse_args()
    res = {False: [], True: []}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(a.rounds):
            for hang in (False, True) if r % 2 == 0 else (True, False):
                res[hang].append(run(tmp, "r%d-%s" % (r, "on" if hang else "off"), hang, a.steps))
    for key, unit in (("step_cpu_ms", "ms"), ("step_wall_ms", "ms"), ("calls_us", "µs")):
        off = statistics.median(x[key] for x in res[False])
        on = statistics.median(x[key] for x in res[True])
        print("%-12s off %.4f %s  on %.4f %s  (%+.2f %%)" % (key, off, unit, on, unit, (on - off) / off * 100))


if __name__ == "__main__":
    main()
