"""bench/run.py, the one table of every benchmark against its peer (BENCHMARKS.md, "Current"):
its Markdown from fixed result lines (no benchmark runs here), and no benchmark left out of it."""

import datetime
import importlib.util
import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parent.parent


def load_run():
    spec = importlib.util.spec_from_file_location("bench_run", ROOT / "bench" / "run.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_the_current_section_is_made_from_the_results_alone():
    run = load_run()
    results = [
        ("agent", {"metric": "CPU per tick", "unit": "µs", "trainprof": 50.0, "peer": 100.0,
                   "peer_name": "psutil", "better": "lower"}),
        ("s3", {"metric": "events/s", "unit": "1/s", "trainprof": 3000.0, "peer": 1000.0,
                "peer_name": "smdebug | writer", "better": "higher"}),
        ("fleet", {"metric": "report, 64 ranks, wall", "unit": "s", "trainprof": 2.5, "peer": None,
                   "peer_name": "smdebug: did not finish", "better": "lower"}),
    ]
    started = datetime.datetime(2026, 11, 28, 10, 5, tzinfo=datetime.timezone.utc)
    md = run.current_section(run.rows_of(results), started, False, "0.42", "abc1234+dirty", ["gpu"])
    lines = md.splitlines()
    assert lines[0] == "## Current"
    assert "abc1234+dirty" in md and "2026-11-28 10:05 UTC" in md and "load average 0.42" in md
    rows = [l for l in lines if l.startswith("| ") and "metric" not in l]
    assert len(rows) == 3, md
    assert rows[0] == "| agent | CPU per tick | µs | 50.0 | 100.0 | 2.0× | psutil |"
    assert rows[1] == "| s3 | events/s | 1/s | 3,000 | 1,000 | 3.0× | smdebug \\| writer |"
    assert rows[2] == "| fleet | report, 64 ranks, wall | s | 2.50 | – | – | smdebug: did not finish |"
    assert lines[-1] == "Did not run to the end (no row, or fewer rows): gpu."


def test_every_benchmark_that_prints_results_is_in_the_table():
    run = load_run()
    # What bench/run.py runs: its commands, and the files the scripts among them name.
    ran = ""
    for _, argv, _, _ in run.BENCHES:
        for a in argv:
            ran += " " + a
            p = ROOT / a
            if a.startswith("scripts/") and p.is_file():
                ran += " " + p.read_text()
    printers = [p for p in list((ROOT / "bench").glob("*.py")) + list((ROOT / "hook-ffi" / "bench").glob("*"))
                if p.name != "run.py" and p.is_file() and re.search(r"RESULT ", p.read_text(errors="replace"))]
    assert len(printers) >= 10
    # A/Bs of this tree against another revision the user names (scripts/bench-hook-steps REV
    # builds that revision's library; bench/py_ab.py REV loads that revision's package beside
    # this one, which needs the same C ABI version), not benchmarks against a peer.
    ab_only = {"step_bench.c", "py_ab.py"}
    missing = [str(p.relative_to(ROOT)) for p in printers if p.name not in ran and p.name not in ab_only]
    assert not missing, "benchmarks printing RESULT lines that bench/run.py does not run: %s" % missing
