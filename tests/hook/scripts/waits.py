"""Waiting on events in the trainer scripts (docs/testing.md, "Waiting in tests"): a script
waits for what it needs to have happened (a dump written), never for a fixed time; the
bound is only there so that a broken build fails instead of hanging."""

import json
import os
import time


def local_path():
    """The config's LocalPath (``SMPROFILER_CONFIG_PATH``), or None with profiling off (no
    config)."""
    try:
        with open(os.environ["SMPROFILER_CONFIG_PATH"]) as f:
            return json.load(f)["ProfilingParameters"]["LocalPath"]
    except (KeyError, OSError, ValueError):
        return None


def stall_dumps(root):
    """How many dumps the hook has finished under ``root`` (``stall.json`` is written last:
    docs/formats.md, "Folder and files")."""
    hangs = os.path.join(root, "framework", "hangs")
    return sum("stall.json" in files for _, _, files in os.walk(hangs))


def wait_for(what, bound_s=30.0):
    """Waits until ``what()`` is true, at most ``bound_s`` (then goes on: the test fails on
    what the script printed or wrote, never hangs). Returns ``what()``."""
    t0 = time.monotonic()
    while not what() and time.monotonic() - t0 < bound_s:
        time.sleep(0.01)
    return what()


def wait_for_dumps(n, bound_s=30.0):
    """With profiling on, waits until ``n`` dumps are finished; with it off, returns at once
    (nothing dumps)."""
    root = local_path()
    if root is not None:
        wait_for(lambda: stall_dumps(root) >= n, bound_s)
