"""A small training loop, timed from outside the hook (docs/formats.md, "The hook's own cost";
tests/hook/test_cost.py, bench/hook_cost.py): ``cost_loop.py MODE STEPS EXTRA [LOCAL_PATH]``.

Each step is pure Python busy work; MODE ``plain`` runs it without trainprof (the calls the
profiled loop makes into the hook are calls to a function that does nothing), ``profiled``
with the hook attached (``step_begin``, ``EXTRA`` calls of ``active("detailed")``,
``step_end``; no window). Prints one JSON line: every step's time, ns, from
``time.perf_counter_ns()`` around the whole step.
"""

import json
import sys
import time


def busy():
    n = 0
    for i in range(2000):
        n += i * i
    return n


def main():
    mode, steps, extra = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    if mode == "profiled":
        import trainprof

        prof = trainprof.Profiler("pytorch")
        begin, end, active = prof.step_begin, prof.step_end, prof.active
    else:
        prof = None

        def begin(*_a):
            return None

        def end(*_a):
            return None

        def active(*_a):
            return False

    clock = time.perf_counter_ns
    times = []
    for _ in range(steps):
        t0 = clock()
        begin()
        busy()
        for _ in range(extra):
            active("detailed")
        end()
        times.append(clock() - t0)
    if prof is not None:
        prof.close()
    print(json.dumps({"step_ns": times}))


if __name__ == "__main__":
    main()
