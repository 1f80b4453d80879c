"""A detailed window's ops through torch's own chrome trace (docs/formats.md, "Detailed windows
through torch's own trace"): the library reads the trace torch wrote into a file it made, off
the training thread. The window's `cpu_functions` events are torch's ops, by name and count,
as plain torch.profiler records them over the same steps, and as the adapter's Python
conversion (its fallback) writes them, each numbered with the step it ran in; a link planted
where torch wrote the trace is never read.
"""

import collections
import json
import pathlib

import pytest

pytest.importorskip("torch")
from test_torch_caps import timeline_objs  # noqa: E402
from test_torch_real import run_training  # noqa: E402

SCRIPT = pathlib.Path(__file__).resolve().parent / "scripts" / "trace_train.py"
WINDOW = {"StartStep": 2, "NumSteps": 3}  # global steps 2, 3, 4


def by_phase(out):
    """{phase: [event]} of the X events of every sealed timeline file."""
    objs = timeline_objs(out)
    names = {e["pid"]: e["args"].get("name", "") for e in objs if e.get("ph") == "M" and e.get("name") == "process_name"}
    got = collections.defaultdict(list)
    for e in objs:
        if e.get("ph") == "X":
            got[names[e["pid"]]].append(e)
    return got


def run(tmp_path, **params):
    tmp_path.mkdir(exist_ok=True)
    return run_training(tmp_path, params, script=SCRIPT, DetailedProfilingConfig=WINDOW)


def test_the_windows_ops_are_torchs_own_and_the_python_conversions(tmp_path):
    out, _, m, proc = run(tmp_path / "trace")
    assert "trainprof:" not in proc.stderr, proc.stderr  # no fallback line
    ev = by_phase(out)
    ops = ev["cpu_functions"]
    assert collections.Counter(e["name"] for e in ops) == collections.Counter(m["plain_ops"])
    # Each op lies in the step it is numbered with.
    steps = {int(e["args"]["step_num"]): e for e in ev["Step:ModeKeys.TRAIN"]}
    assert {e["args"]["step_num"] for e in ops} == {"2", "3", "4"}
    for e in ops:
        s = int(e["args"]["step_num"])
        assert steps[s]["ts"] <= e["ts"] < steps[s + 1]["ts"], e
        assert isinstance(e["args"]["tid"], int) and e["args"]["tid"] > 0, e
    # The files torch wrote are gone; the folder is the hook's own.
    folder = out / ".trainprof-torch"
    assert list(folder.iterdir()) == []
    assert folder.stat().st_mode & 0o777 == 0o700

    # The fallback (torch's results read in Python) writes the same events.
    out2, _, m2, _ = run(tmp_path / "python", python_conversion=True)
    ops2 = by_phase(out2)["cpu_functions"]
    assert collections.Counter((e["name"], e["args"]["step_num"]) for e in ops2) == collections.Counter(
        (e["name"], e["args"]["step_num"]) for e in ops
    )
    assert not (out2 / ".trainprof-torch").exists()


def test_a_link_planted_where_torch_wrote_the_trace_is_not_read(tmp_path):
    out, _, m, proc = run(tmp_path, plant_link=True)
    path = pathlib.Path(m["planted"]["path"])
    assert path.parent == out / ".trainprof-torch"
    ev = by_phase(out)
    assert ev["cpu_functions"] == [], ev["cpu_functions"][:3]
    assert "is not the file the hook made for torch's trace (a symbolic link): not read" in proc.stderr
    # The link is left as it is (not the hook's to remove), its target untouched.
    assert path.is_symlink()
    assert json.loads((tmp_path / "decoy.json").read_text())["traceEvents"][0]["name"] == "planted::op"
    # The rest of the window is written.
    assert {e["args"]["step_num"] for e in ev["Forward"]} == {"2", "3", "4"}
