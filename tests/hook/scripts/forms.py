"""The forms of Profiler.record and the package's messages; writes what happened into the
manifest. Run in a subprocess by test_record.py. TRAINPROF_TEST_PARAMS["case"] picks:

* ``record``: ``record`` as a context manager and as a decorator (plain, with args, a
  coroutine function, a recursive function, after close);
* ``messages``: the ``trainprof`` logger and TrainprofWarning under the user's filters.
"""

import asyncio
import json
import logging
import os
import time
import warnings

import trainprof

PARAMS = json.loads(os.environ.get("TRAINPROF_TEST_PARAMS") or "{}")
CASE = PARAMS["case"]
r = {}

if CASE == "record":
    prof = trainprof.Profiler(framework="pytorch")
    prof.step_begin("train")
    with prof.record("Forward", "block") as span:
        r["span_type"] = type(span).__name__
        time.sleep(0.002)
    try:
        with prof.record("Forward", "raises"):
            raise KeyError("from the block")
    except KeyError:
        r["exception_propagated"] = True

    @prof.record("Decorated", "fn", args={"n": 3})
    def fn(x):
        """fn's doc"""
        time.sleep(0.001)
        return x * 2

    r["results"] = [fn(i) for i in range(3)]
    r["wrapped"] = [fn.__name__, fn.__doc__]

    @prof.record("Decorated", "coro")
    async def coro():
        await asyncio.sleep(0.002)
        return "done"

    r["coroutine_function"] = asyncio.iscoroutinefunction(coro)
    r["coro"] = asyncio.run(coro())

    @prof.record("Decorated", "fact")
    def fact(n):
        return 1 if n <= 1 else n * fact(n - 1)

    r["fact"] = fact(4)
    prof.step_end()
    prof.close()

    def late():
        return 1

    r["after_close_is_the_function"] = prof.record("Decorated", "late")(late) is late
    r["stats"] = prof.stats()
elif CASE == "messages":
    records = []

    class Keep(logging.Handler):
        def emit(self, record):
            records.append([record.name, record.levelname, record.getMessage()])

    logging.getLogger("trainprof").addHandler(Keep())
    prof = trainprof.Profiler(framework="pytorch")  # TRAINPROF_DISABLE is set: logged
    r["init_status"] = prof.init_status
    prof = trainprof.Profiler(framework="pytorch")  # said once
    # The user's filters decide about a TrainprofWarning: recorded, turned into an error
    # (never raised into the loop: logged instead), ignored.
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainprof._log.warn_user("a warning for the user", stacklevel=1, key="test-recorded")
    r["caught"] = [[w.category.__name__, str(w.message), os.path.basename(w.filename)] for w in caught]
    with warnings.catch_warnings():
        warnings.simplefilter("error", trainprof.TrainprofWarning)
        trainprof._log.warn_user("an error by the user's filter", key="test-error")
        r["error_filter_did_not_raise"] = True
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", trainprof.TrainprofWarning)
        trainprof._log.warn_user("an ignored warning", key="test-ignored")
    r["records"] = records
else:
    raise SystemExit("unknown case " + CASE)

with open(os.environ["TRAINPROF_TEST_MANIFEST"], "w") as f:
    json.dump(r, f)
