"""Window caps on a real torch.profiler window (docs/formats.md, "Window caps"): a detailed
window over 40 steps of 2,000 small ops each, with ``with_stack`` and ``record_shapes``,
grows the trainer with every step; with a small cap it stops early, says so, the trainer's
peak resident memory stays within a bound of the cap, and training ends normally.
"""

import json
import pathlib

import pytest

pytest.importorskip("torch")
from test_torch_real import run_training  # noqa: E402

SCRIPT = pathlib.Path(__file__).resolve().parent / "scripts" / "caps_train.py"
WINDOW = {"StartStep": 2, "NumSteps": 36}
MiB = 1 << 20


def timeline_objs(out):
    """Every object of every sealed timeline file."""
    objs = []
    for p in sorted((out / "framework" / "pevents").rglob("*.json")):
        objs.extend(json.loads(p.read_text()))
    return objs


def capped_events(out):
    return [e for e in timeline_objs(out) if e.get("name") == "trainprof:WindowCapped"]


def test_a_with_stack_window_stops_at_its_memory_cap(tmp_path):
    out, _, m, proc = run_training(
        tmp_path,
        {"steps": 40, "ops": 2000},
        script=SCRIPT,
        DetailedProfilingConfig=WINDOW,
        WindowCapsConfig={"DetailedMaxMemoryMiB": 64},
    )
    (c,) = capped_events(out)
    a = c["args"]
    assert (a["feature"], a["cap"], a["limit"]) == ("detailed", "bytes", 64 * MiB), a
    assert a["value"] >= 64 * MiB
    assert 2 < a["step"] < 38, "stopped inside the window, not at its end"
    assert "the detailed window stopped at its cap" in proc.stderr
    # Bounded: the growth while collecting is the cap; torch.profiler's own processing of what
    # it collected, at stop, costs a multiple of it (docs/formats.md, "Window caps": about 9x
    # here), not the window's 36 steps (which would be 6x more again).
    grown = m["peak"] - m["before"]["rss"]
    print("peak RSS growth %.0f MiB with a 64 MiB cap, stopped at step %d at %.0f MiB" % (grown / MiB, a["step"], a["value"] / MiB))
    assert grown < 24 * 64 * MiB, grown / MiB


def test_a_window_stops_writing_at_its_event_cap(tmp_path):
    out, _, m, proc = run_training(
        tmp_path,
        {"steps": 8, "ops": 500},
        script=SCRIPT,
        DetailedProfilingConfig={"StartStep": 2, "NumSteps": 4},
        WindowCapsConfig={"DetailedMaxEvents": 1000, "DetailedMaxMemoryMiB": 8192},
    )
    (c,) = capped_events(out)
    a = c["args"]
    # Reached while the ops were written, after the window: the first op left out is of step 2.
    assert (a["feature"], a["cap"], a["value"], a["limit"], a["step"]) == ("detailed", "events", 1000, 1000, 2), a
    objs = timeline_objs(out)
    names = {e["pid"]: e["args"].get("name", "") for e in objs if e.get("ph") == "M" and e.get("name") == "process_name"}
    written = [e for e in objs if e.get("ph") == "X" and names.get(e["pid"], "").startswith(("Forward", "cpu_functions"))]
    assert len(written) == 1000, len(written)
