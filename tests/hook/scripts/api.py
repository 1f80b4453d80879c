"""The package's argument checking and error messages; writes what happened into the
manifest. Run in a subprocess by test_package.py. TRAINPROF_TEST_PARAMS["case"] picks:

* ``errors``: programmer mistakes raise ValueError, with profiling on;
* ``load``: Profiler() (``strict`` from the params) with whatever TRAINPROF_HOOK_LIB says;
  the error, if any;
* ``abi``: the same, when the package expects another ABI version;
* ``import``: what importing trainprof pulls in;
* ``names``: 100 distinct event names (run with a small TRAINPROF_MAX_NAMES).
"""

import json
import os
import sys

PARAMS = json.loads(os.environ.get("TRAINPROF_TEST_PARAMS") or "{}")
CASE = PARAMS["case"]
r = {}


def outcome(fn):
    try:
        return {"ok": repr(fn())}
    except Exception as e:
        return {"error": type(e).__name__, "message": str(e), "import_error": isinstance(e, ImportError)}


if CASE == "import":
    before = set(sys.modules)
    import trainprof  # noqa: F401

    r["new_modules"] = sorted(set(sys.modules) - before)
    r["torch"] = "torch" in sys.modules
    r["tensorflow"] = "tensorflow" in sys.modules
    with open("/proc/self/maps") as f:
        r["library_mapped"] = "libtrainprof_hook" in f.read()
    r["loaded"] = len(trainprof._lib._cache)
elif CASE == "load":
    import trainprof

    r["profiler"] = outcome(lambda: trainprof.Profiler(framework="pytorch", strict=PARAMS.get("strict", False)))
elif CASE == "abi":
    import trainprof

    trainprof._lib.ABI_VERSION = 4
    r["profiler"] = outcome(lambda: trainprof.Profiler(framework="pytorch", strict=PARAMS.get("strict", False)))
elif CASE == "names":
    import trainprof

    prof = trainprof.Profiler(framework="pytorch")
    # Count the calls into the library that register a name.
    register = prof._lib.trainprof_register_name
    calls = [0]

    def counting(*args):
        calls[0] += 1
        return register(*args)

    prof._lib.trainprof_register_name = counting
    t = prof.now_us()
    for i in range(100):
        prof.record_event("Forward", "name-%d" % i, t + i, t + i + 1)
    prof.close()
    r["stats"] = prof.stats()
    r["dropped"] = prof.dropped
    r["cached_names"] = len(prof._names)
    r["register_calls"] = calls[0]
elif CASE == "errors":
    import trainprof

    r["framework"] = outcome(lambda: trainprof.Profiler(framework="caffe"))
    prof = trainprof.Profiler(framework="pytorch")
    r["init_status"] = prof.init_status
    r["mode"] = outcome(lambda: prof.step_begin("training"))
    r["negative_step"] = outcome(lambda: prof.step_begin("train", step=-2))
    r["feature"] = outcome(lambda: prof.active("gpu"))
    r["dataloader_without_name"] = outcome(lambda: prof.active("dataloader"))
    r["five_args"] = outcome(lambda: prof.record("A", "B", args={"a": 1, "b": 2, "c": 3, "d": 4, "e": 5}))
    r["string_arg"] = outcome(lambda: prof.record("A", "B", args={"a": "text"}))
    r["name_not_str"] = outcome(lambda: prof.record("A", 7))
    r["nul_in_name"] = outcome(lambda: prof.record("A", "B\0C"))
    r["end_before_start"] = outcome(lambda: prof.record_event("A", "B", 10, 5))
    r["nan_time"] = outcome(lambda: prof.record_event("A", "B", float("nan"), 5))
    r["int64_overflow"] = outcome(lambda: prof.record("A", "B", args={"a": 2**63}))
    # Valid calls still work after all that.
    r["step"] = prof.step_begin("train", step=7)
    r["next_step"] = prof.step_begin("train")
    r["eval_step"] = prof.step_begin("eval")
    with prof.record("Forward", "Net", args={"a": -(2**63), "b": False, "c": 1e300, "d": 3}):
        pass
    prof.step_end()
    r["step_end_twice"] = outcome(prof.step_end)
    prof.close()
    r["close_twice"] = outcome(prof.close)
    r["stats"] = prof.stats()
    r["registered_names"] = sorted(prof._names)
else:
    raise SystemExit("unknown case " + CASE)

with open(os.environ["TRAINPROF_TEST_MANIFEST"], "w") as f:
    json.dump(r, f)
