"""Memory snapshots of the PyTorch adapter (docs/formats.md, "Memory windows") without a GPU:
scripts/torch_memory_fake.py runs a loop with a fake torch whose CUDA memory calls it
records; the real library makes the files, the real package writes them."""

import importlib.util
import os
import pathlib
import pickle
import re

import pytest

if importlib.util.find_spec("torch") is not None:
    pytest.skip("torch is installed: this tier fakes it", allow_module_level=True)

SCRIPT = pathlib.Path(__file__).resolve().parent / "scripts" / "torch_memory_fake.py"
WINDOW = {"MemoryProfilingConfig": {"StartStep": 3, "NumSteps": 2, "MaxEntries": 5000}}
OOM = {"MemoryProfilingConfig": {"OomSnapshot": True, "MaxEntries": 2000}, "HangDetectionConfig": {"HangTimeoutS": 600}}


def traceback_of(run):
    """The uncaught exception's traceback on stderr, from "Traceback" to its last line."""
    lines = run.proc.stderr.splitlines()
    start = lines.index("Traceback (most recent call last):")
    end = next(i for i in range(start + 1, len(lines)) if not lines[i].startswith(" "))
    return lines[start : end + 1]


def snapshots(run):
    """{node: sorted file names} under framework/memory/."""
    root = run.out / "framework" / "memory"
    if not root.is_dir():
        return {}
    return {d.name: sorted(p.name for p in d.iterdir()) for d in root.iterdir()}


def the_snapshot(run, pattern):
    (node, names), *rest = snapshots(run).items()
    assert rest == [] and len(names) == 1 and re.fullmatch(pattern, names[0]), snapshots(run)
    path = run.out / "framework" / "memory" / node / names[0]
    return path, pickle.loads(path.read_bytes())


@pytest.mark.parametrize("stand_in", [False, True], ids=["fake-torch", "stand-in"])
def test_a_window_dumps_once_at_its_end_then_history_is_off(run_trainer, stand_in):
    run = run_trainer(SCRIPT, {"steps": 8, "stand_in": stand_in}, config=WINDOW).check()
    assert run.warnings() == []
    # History on at step 3 (bounded, Python stacks), the snapshot at the begin of step 5,
    # then history off; nothing else.
    assert run.manifest["calls"] == [["record", 5000, "python"], ["snapshot", 5, True], ["stop"]]
    path, snap = the_snapshot(run, r"window-3-4-\d{16}\.pickle")
    assert snap["device_traces"][0][0]["frames"][0] == {"filename": "train.py", "line": 15, "name": "forward"}
    assert (path.stat().st_mode & 0o777) == 0o600


def test_a_window_still_open_at_close_is_dumped_and_none_without_config(run_trainer):
    unconfigured = run_trainer(SCRIPT, {"steps": 8}, config={"DetailedProfilingConfig": {"StartStep": 9}}).check()
    assert unconfigured.manifest["calls"] == [] and snapshots(unconfigured) == {}
    config = {"MemoryProfilingConfig": {"StartStep": 6, "NumSteps": 5, "Stacks": "all"}}
    run = run_trainer(SCRIPT, {"steps": 8}, config=config).check()
    assert run.manifest["calls"] == [["record", 100000, "all"], ["snapshot", 7, True], ["stop"]]
    the_snapshot(run, r"window-6-7-\d{16}\.pickle")


def test_a_planted_link_at_the_snapshot_folder_is_refused(run_trainer, tmp_path):
    # framework/memory is a link to elsewhere: nothing is written through it, one line says
    # why, and the trainer goes on with history turned off as before.
    local = tmp_path / "planted"
    elsewhere = tmp_path / "elsewhere"
    (local / "framework").mkdir(parents=True)
    elsewhere.mkdir()
    os.symlink(elsewhere, local / "framework" / "memory")
    run = run_trainer(SCRIPT, {"steps": 8}, config=WINDOW, env={"TRAINPROF_LOCAL_PATH": local}).check()
    assert list(elsewhere.iterdir()) == []
    assert any("memory snapshot" in w for w in run.warnings()), run.warnings()
    assert run.manifest["calls"] == [["record", 5000, "python"], ["snapshot", 5, True], ["stop"]]
    assert (local / "framework" / "memory").is_symlink()


def test_oom_dumps_exactly_one_snapshot_whatever_the_repeats(run_trainer):
    plain = run_trainer(SCRIPT, {"steps": 8, "oom_at": 4, "plain": True}, config=OOM)
    run = run_trainer(SCRIPT, {"steps": 8, "oom_at": 4, "observer_repeats": 3}, config=OOM)
    # The trainer's exception and exit status as without trainprof.
    assert plain.proc.returncode == run.proc.returncode == 1
    assert traceback_of(plain)[-1] == "OutOfMemoryError: CUDA out of memory. Tried to allocate 1.00 GiB"
    assert traceback_of(run) == traceback_of(plain)
    # History on from the start, the observer registered, one snapshot at the OOM, with
    # history still on; the observer's three calls gave one file; history off at exit.
    assert run.manifest["calls"] == [["record", 2000, "python"], ["observe"], ["snapshot", 4, True], ["stop"]]
    path, _ = the_snapshot(run, r"oom-4-\d{16}\.pickle")
    # The flight recorder's exception dump names it.
    dumps = list((run.out / "framework" / "hangs").rglob("traceback.txt"))
    assert len(dumps) == 1, dumps
    text = dumps[0].read_text()
    assert "OutOfMemoryError: CUDA out of memory" in text
    assert text.splitlines()[-1] == f"trainprof: memory snapshot at the out-of-memory error: {path}"


def test_oom_without_an_observer_is_caught_at_the_forward_once(run_trainer):
    params = {"steps": 8, "oom_at": 2, "observer": False, "catch_oom": True}
    plain = run_trainer(SCRIPT, {**params, "plain": True}, config=OOM).check()
    run = run_trainer(SCRIPT, {**params, "oom_at": 2}, config=OOM).check()
    assert run.proc.stdout == plain.proc.stdout == "caught\n"
    assert run.manifest["calls"] == [["record", 2000, "python"], ["snapshot", 2, True], ["stop"]]
    the_snapshot(run, r"oom-2-\d{16}\.pickle")


def test_an_oom_the_trainer_catches_one_snapshot_and_training_goes_on(run_trainer):
    run = run_trainer(SCRIPT, {"steps": 8, "oom_at": 5, "catch_oom": True}, config=OOM).check()
    assert run.proc.stdout == "caught\n"
    assert [c for c in run.manifest["calls"] if c[0] == "snapshot"] == [["snapshot", 5, True]]
    the_snapshot(run, r"oom-5-\d{16}\.pickle")
    assert run.manifest["calls"][-1] == ["stop"]
