"""A real full disk under LocalPath: a small tmpfs that the test fills while a trainer
records, then frees. The hook must keep every event written before, drop and count what
comes while it is full, and write again once there is room, with no file lost.

Needs root (mount); skipped, with the reason, where tmpfs cannot be mounted."""

import collections
import json
import os
import subprocess
import sys

import pytest
from conftest import SCRIPTS
from smdebug.profiler.algorithm_metrics_reader import LocalAlgorithmMetricsReader
from trainer_runs import CLEARED_ENV, PACKAGE_DIR, profiler_config


@pytest.fixture
def small_disk(tmp_path):
    mnt = tmp_path / "disk"
    mnt.mkdir()
    try:
        mounted = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(mnt)], capture_output=True, text=True
        )
    except OSError as e:
        pytest.skip(f"cannot run mount: {e}")
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs (needs root): {mounted.stderr.strip()}")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


def fill(path):
    """Writes `path` until the disk is full."""
    chunk = b"\0" * 65536
    with open(path, "wb", buffering=0) as f:
        while True:
            try:
                f.write(chunk)
            except OSError:
                break
        for size in (4096, 1):  # the last partial blocks too
            while True:
                try:
                    if f.write(b"\0" * size) == 0:
                        break
                except OSError:
                    break


def wait_for(proc, path):
    while not path.exists():
        if proc.poll() is not None:
            raise AssertionError(f"the trainer exited with {proc.returncode}:\n{proc.stderr.read()}")
        try:
            proc.wait(timeout=0.005)
        except subprocess.TimeoutExpired:
            pass


def test_a_full_disk_loses_only_what_comes_while_it_is_full(tmp_path, small_disk, hook_lib):
    sync = tmp_path / "sync"
    sync.mkdir()
    config = tmp_path / "profilerconfig.json"
    config.write_text(json.dumps(profiler_config(small_disk)))
    manifest = tmp_path / "manifest.json"
    env = {k: v for k, v in os.environ.items() if k not in CLEARED_ENV}
    env.update(
        PYTHONPATH=str(PACKAGE_DIR),
        PYTHONDONTWRITEBYTECODE="1",
        TRAINPROF_HOOK_LIB=str(hook_lib),
        SMPROFILER_CONFIG_PATH=str(config),
        TRAINPROF_RESOURCE_CONFIG=str(tmp_path / "no-resourceconfig.json"),
        TRAINPROF_TEST_MANIFEST=str(manifest),
        TRAINPROF_TEST_PARAMS=json.dumps({"sync": str(sync)}),
    )
    proc = subprocess.Popen(
        [sys.executable, str(SCRIPTS / "disk_full.py")],
        env=env,
        cwd=str(tmp_path),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    filler = small_disk / "filler"
    try:
        wait_for(proc, sync / "fill")
        fill(filler)
        (sync / "filled").touch()
        wait_for(proc, sync / "free")
        filler.unlink()
        (sync / "freed").touch()
        _, stderr = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, stderr
    m = json.loads(manifest.read_text())
    recorded, stats = m["recorded"], m["stats"]

    events = LocalAlgorithmMetricsReader(trace_root_folder=str(small_disk)).get_events(0, 10**18)
    by_phase = collections.defaultdict(list)
    for e in events:
        by_phase[e.event_phase].append(int(e.event_args["step_num"]))
    # Everything written before the disk filled is there, once.
    assert sorted(by_phase["Before"]) == list(range(recorded["Before"]))
    # Writing came back by itself: the events after the space returned are there.
    assert len(by_phase["After"]) >= 50
    # Every event is in a sealed file or counted as dropped, and some were dropped.
    assert stats["dropped_queue_full"] == 0
    assert len(events) == stats["written"]
    assert stats["written"] + stats["dropped_writer"] == sum(recorded.values())
    assert stats["dropped_writer"] > 0 and m["dropped"] == stats["dropped_writer"]
    assert stats["open_failures"] == 0
    # Sealed, valid JSON, nothing left temporary or aside; besides the timelines, the hook's
    # own cost record (docs/formats.md, "The hook's own cost"), whose drops are the writer's.
    files = [os.path.join(d, f) for d, _, fs in os.walk(small_disk) for f in fs]
    cost = [f for f in files if os.sep + os.path.join("framework", "cost") + os.sep in f]
    files = [f for f in files if f not in cost]
    assert files and all(f.endswith("_pythontimeline.json") for f in files), files
    assert len(cost) == 1, cost
    with open(cost[0]) as fh:
        record = json.load(fh)
    assert record["EventsDropped"] == stats["dropped_writer"] and record["EventsWritten"] == stats["written"], record
    assert record["BytesWritten"] == sum(os.path.getsize(f) for f in files), record
    for f in files:
        with open(f) as fh:
            json.load(fh)
    assert "the disk is full" in stderr and "timeline writing resumed" in stderr, stderr
