"""Window caps (``WindowCapsConfig``, docs/formats.md, "Window caps"): a plain-Python trainer
through ``trainprof.torch`` (tests/hook/scripts/capped_trainer.py) with tiny caps stops its
detailed and dataloader windows at them, says so in the timeline, on stderr and in the
report; with the caps out of reach nothing is capped.

The detailed window (steps 2-5) writes three ``Forward`` events a step; the dataloader window
(steps 2-5) one ``DataLoaderIter`` event a batch.
"""

import json
import subprocess

from test_auto_profiling import timeline

CAPPED = "trainprof:WindowCapped"
WINDOWS = {
    "DetailedProfilingConfig": {"StartStep": 2, "NumSteps": 4},
    "DataloaderProfilingConfig": {"StartStep": 2, "NumSteps": 4},
}


def by_phase(objs):
    """(phase name, event) for every complete and instant event."""
    names = {e["pid"]: e["args"]["name"] for e in objs if e.get("ph") == "M" and e["name"] == "process_name"
             and "name" in e["args"]}
    return [(names.get(e["pid"], "?"), e) for e in objs if e.get("ph") in ("X", "i")]


def run(run_script, caps):
    config = dict(WINDOWS)
    if caps is not None:
        config["WindowCapsConfig"] = caps
    r = run_script("capped_trainer.py", {"steps": 10}, config=config).check()
    events = by_phase(timeline(r.out))
    return r, events


def test_tiny_caps_stop_the_windows_and_say_so(run_script, trainprof_bin, tmp_path):
    r, events = run(run_script, {"DetailedMaxEvents": 4, "DataloaderMaxEvents": 2})
    assert r.manifest["caps"]["detailed_max_events"] == 4
    forward = sorted({int(e["args"]["step_num"]) for p, e in events if p.startswith("Forward")})
    # Steps 2 and 3 wrote 6 events; at step 4's boundary the window stopped.
    assert forward == [2, 3], forward
    dl = [int(e["args"]["step_num"]) for p, e in events if p == "DataLoaderIter"]
    assert dl == [2, 3], dl
    capped = {e["args"]["feature"]: e for _, e in events if e["name"] == CAPPED}
    assert sorted(capped) == ["dataloader", "detailed"], capped
    d = capped["detailed"]
    assert (d["ph"], d["s"]) == ("i", "g")
    assert {k: d["args"][k] for k in ("cap", "value", "limit", "step")} == {
        "cap": "events", "value": 6, "limit": 4, "step": 4}
    a = capped["dataloader"]["args"]
    assert (a["cap"], a["value"], a["limit"], a["step"]) == ("events", 2, 2, 3)
    err = r.proc.stderr
    assert err.count("stopped at its cap") == 2, err
    assert "the detailed window stopped at its cap at step 4: 6 events (cap 4" in err, err
    # The report marks both windows.
    rep = subprocess.run([str(trainprof_bin), "report", str(r.out), "--json"], capture_output=True, text=True)
    assert rep.returncode == 0, rep.stderr
    got = json.loads(rep.stdout)["capped_windows"]
    assert sorted((w["feature"], w["cap"], w["value"], w["limit"], w["step"]) for w in got) == [
        ("dataloader", "events", 2, 2, 3), ("detailed", "events", 6, 4, 4)], got
    page = tmp_path / "page.html"
    rep = subprocess.run([str(trainprof_bin), "report", str(r.out), "-o", str(page)], capture_output=True, text=True)
    assert rep.returncode == 0, rep.stderr
    assert "stopped at its cap: 6 events at step 4" in page.read_text()


def test_caps_out_of_reach_cap_nothing(run_script, trainprof_bin):
    r, events = run(run_script, None)
    assert r.manifest["caps"]["detailed_max_events"] == 2_000_000
    forward = sorted({int(e["args"]["step_num"]) for p, e in events if p.startswith("Forward")})
    assert forward == [2, 3, 4, 5], forward
    assert [int(e["args"]["step_num"]) for p, e in events if p == "DataLoaderIter"] == [2, 3, 4, 5]
    assert [e for _, e in events if e["name"] == CAPPED] == []
    assert "stopped at its cap" not in r.proc.stderr
    rep = subprocess.run([str(trainprof_bin), "report", str(r.out), "--json"], capture_output=True, text=True)
    assert rep.returncode == 0, rep.stderr
    assert "capped_windows" not in json.loads(rep.stdout)


def test_a_bad_cap_keeps_its_default_with_one_line(run_script):
    r, events = run(run_script, {"DetailedMaxEvents": 0, "DataloaderMaxEvents": 2})
    assert r.manifest["caps"]["detailed_max_events"] == 2_000_000
    assert r.manifest["caps"]["dataloader_max_events"] == 2
    assert r.proc.stderr.count("WindowCapsConfig.DetailedMaxEvents: 0 is outside") == 1, r.proc.stderr
    assert sorted({int(e["args"]["step_num"]) for p, e in events if p.startswith("Forward")}) == [2, 3, 4, 5]
