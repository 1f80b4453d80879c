"""``Profiler.record`` as a context manager and as a decorator, and how the package tells
the user things (``warnings`` and the ``trainprof`` logger, docs/python.md)."""

import collections

from smdebug.profiler.algorithm_metrics_reader import LocalAlgorithmMetricsReader


def test_record_is_a_context_manager_and_a_decorator(run_script):
    run = run_script("forms.py", {"case": "record"}, config={}).check()
    m = run.manifest
    assert m["span_type"] == "Span" and m["exception_propagated"] is True
    assert m["results"] == [0, 2, 4] and m["wrapped"] == ["fn", "fn's doc"]
    assert m["coroutine_function"] is True and m["coro"] == "done" and m["fact"] == 24
    assert m["after_close_is_the_function"] is True
    assert run.warnings() == []

    events = LocalAlgorithmMetricsReader(trace_root_folder=str(run.out)).get_events(0, 10**18)
    by_name = collections.defaultdict(list)
    for e in events:
        by_name[(e.event_phase, e.event_name)].append(e)
    assert sorted(n for _, n in by_name) == ["Step:ModeKeys.TRAIN", "block", "coro", "fact", "fn", "raises"]
    # One event per block, per call (each recursive call its own), all in step 0.
    counts = {k: len(v) for k, v in by_name.items()}
    assert counts == {
        ("Forward", "block"): 1,
        ("Forward", "raises"): 1,
        ("Decorated", "fn"): 3,
        ("Decorated", "coro"): 1,
        ("Decorated", "fact"): 4,
        ("Step:ModeKeys.TRAIN", "Step:ModeKeys.TRAIN"): 1,
    }
    assert all(e.event_args["step_num"] == "0" for e in events)
    # Times are the block's and the call's (µs).
    assert by_name[("Forward", "block")][0].duration >= 2_000
    assert all(e.duration >= 1_000 and e.event_args["n"] == 3 for e in by_name[("Decorated", "fn")])
    assert by_name[("Decorated", "coro")][0].duration >= 2_000  # the awaited coroutine, not its creation
    # Outer calls first: starts can tie at µs resolution, and the outer call ends last.
    facts = sorted(by_name[("Decorated", "fact")], key=lambda e: (e.start_time, -e.end_time))
    assert [e.end_time >= f.end_time for e, f in zip(facts, facts[1:])] == [True] * 3  # nested calls
    assert m["stats"]["written"] == len(events)


def test_messages_go_to_the_logger_and_warnings_to_the_users_filters(run_script):
    run = run_script("forms.py", {"case": "messages"}, config={}, env={"TRAINPROF_DISABLE": "1"}).check()
    m = run.manifest
    off = "profiling is off (TRAINPROF_DISABLE=1); the trainprof calls do nothing"
    assert m["init_status"] == 3  # DISABLED
    # Once, through the `trainprof` logger: to the user's handler and to stderr.
    assert m["records"] == [["trainprof", "WARNING", off], ["trainprof", "WARNING", "an error by the user's filter"]]
    assert m["caught"] == [["TrainprofWarning", "a warning for the user", "forms.py"]]
    assert m["error_filter_did_not_raise"] is True
    assert run.warnings() == ["trainprof: " + off, "trainprof: an error by the user's filter"], run.proc.stderr
    assert "ignored" not in run.proc.stderr and "Traceback" not in run.proc.stderr
