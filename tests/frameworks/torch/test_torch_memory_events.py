"""A detailed window's memory events (docs/formats.md, "Memory events"; docs/report.md, "Memory
over the detailed windows"): with torch.profiler's ``profile_memory`` on a CPU model, torch's
``[memory]`` events go through the trace the library imports into ``trainprof:Memory`` events,
and the report shows allocated memory over the window with its peak: three 16 MiB tensors
planted in one step, held at once."""

import json
import pathlib
import subprocess

import pytest

pytest.importorskip("torch")
from test_torch_caps import timeline_objs  # noqa: E402
from test_torch_real import run_training  # noqa: E402

SCRIPT = pathlib.Path(__file__).resolve().parent / "scripts" / "memory_train.py"
WINDOW = {"StartStep": 2, "NumSteps": 3}  # global steps 2, 3, 4
MIB = 1 << 20


def test_memory_over_the_window_has_the_planted_peak(tmp_path, trainprof_bin):
    out, _, m, proc = run_training(tmp_path, {}, script=SCRIPT, DetailedProfilingConfig=WINDOW)
    assert "trainprof:" not in proc.stderr, proc.stderr  # the trace was imported, no fallback
    objs = timeline_objs(out)
    pids = [e["pid"] for e in objs if e.get("name") == "process_name" and e["args"].get("name") == "trainprof:Memory"]
    assert pids, "no memory events in the timeline"
    mem = [e for e in objs if e.get("pid") in pids and e.get("ph") == "X"]
    assert {e["args"]["step_num"] for e in mem} <= {"2", "3", "4"}
    assert all(e["name"] == "[memory]" and e["args"]["Device Type"] == 0 for e in mem)

    page = tmp_path / "page.html"
    proc = subprocess.run([str(trainprof_bin), "report", str(out), "--json", "-o", str(page)],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    (w,) = json.loads(proc.stdout)["memory"]["windows"]
    assert (w["device"], w["first_step"], w["last_step"]) == ("cpu", 2, 4)
    # The planted tensors, and the model's few KiB beside them.
    planted = m["bytes"]
    assert planted <= w["peak_allocated_bytes"] < planted + MIB, w
    assert w["peak_step"] == 3
    assert m["planted"]["before_s"] <= w["peak_s"] <= m["planted"]["after_s"]
    assert max(p[1] for p in w["chart"]) == w["peak_allocated_bytes"]
    assert w["events"] == len(mem)
    text = page.read_text()
    assert "Over the detailed windows" in text
    assert 'aria-label="allocated memory over the ' in text
