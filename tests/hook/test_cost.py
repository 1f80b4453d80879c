"""The hook's own cost (docs/formats.md, "The hook's own cost"; docs/report.md, "What
profiling cost") against an outside measurement: the same small training loop
(tests/hook/scripts/cost_loop.py) runs plain and with the hook attached, timing each of its
steps itself; the hook's time per step that ``trainprof report --json`` shows must be
non-zero, must not exceed the measured difference (profiled − plain) by more than a generous
slack, and must move with it when a planted cost (extra hook calls per step) is added.

The bounds are generous on purpose (a shared 2-core machine): medians over many steps, the
hook's figure checked against the difference within a factor of two, never a time alone.
"""

import json
import os
import statistics
import subprocess
import sys

from trainer_runs import CLEARED_ENV, PACKAGE_DIR

from conftest import SCRIPTS

STEPS = 600
ROUNDS = 3
# The planted cost: calls of active("detailed") a step, each one timed by the hook.
PLANTED = 150


def run_loop(tmp_path, hook_lib, mode, extra, name):
    out = tmp_path / name
    env = {k: v for k, v in os.environ.items() if k not in CLEARED_ENV}
    env.update(PYTHONPATH=str(PACKAGE_DIR), TRAINPROF_HOOK_LIB=str(hook_lib), TRAINPROF_LOCAL_PATH=str(out))
    proc = subprocess.run(
        [sys.executable, str(SCRIPTS / "cost_loop.py"), mode, str(STEPS), str(extra)],
        capture_output=True, text=True, timeout=120, env=env,
    )
    assert proc.returncode == 0, proc.stderr
    steps = json.loads(proc.stdout.splitlines()[-1])["step_ns"]
    assert len(steps) == STEPS
    return out, statistics.median(steps) / 1000.0


def hook_ranks(trainprof_bin, out):
    proc = subprocess.run([str(trainprof_bin), "report", str(out), "--json"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    cost = json.loads(proc.stdout)["profiling_cost"]
    return cost, [r for r in cost["ranks"] if r["hook"] is not None]


def measure(tmp_path, hook_lib, trainprof_bin, extra, tag):
    """(the hook's µs per step from the report, the measured µs per step profiled − plain),
    the plain and profiled runs alternated ROUNDS times and each side's smallest median kept."""
    plain, profiled, outs = [], [], []
    for i in range(ROUNDS):
        plain.append(run_loop(tmp_path, hook_lib, "plain", extra, f"{tag}-plain{i}")[1])
        out, us = run_loop(tmp_path, hook_lib, "profiled", extra, f"{tag}-profiled{i}")
        profiled.append(us)
        outs.append(out)
    cost, ranks = hook_ranks(trainprof_bin, outs[0])
    assert cost["hook_recorded"] and len(ranks) == 1, cost
    hook = ranks[0]["hook"]
    assert hook["steps"] == STEPS, hook
    reported = [hook["us_per_step"]]
    for out in outs[1:]:
        reported.append(hook_ranks(trainprof_bin, out)[1][0]["hook"]["us_per_step"])
    return min(reported), min(profiled) - min(plain), min(plain), hook


def test_the_hooks_own_figure_agrees_with_plain_against_profiled(tmp_path, hook_lib, trainprof_bin):
    base_hook, base_diff, plain_us, hook = measure(tmp_path, hook_lib, trainprof_bin, 0, "base")
    parts = {p["part"]: p for p in hook["parts"]}
    # Two step calls a step, each timed in both layers; no window ran.
    assert parts["python.step"]["calls"] == 2 * STEPS and parts["abi.step"]["calls"] == 2 * STEPS, parts
    assert hook["windows"] == [] and hook["events_dropped"] == 0 and hook["bytes_written"] > 0, hook
    assert base_hook > 0, hook
    # The slack: the machine's noise between runs (the hook's clock also counts the time the
    # trainer's thread was preempted inside it).
    slack = 50.0 + 0.25 * plain_us
    assert base_hook <= max(base_diff, 0.0) + slack, (base_hook, base_diff, plain_us)

    planted_hook, planted_diff, planted_plain, hook = measure(tmp_path, hook_lib, trainprof_bin, PLANTED, "planted")
    parts = {p["part"]: p for p in hook["parts"]}
    assert parts["python.active"]["calls"] == PLANTED * STEPS, parts
    # The planted calls move both figures, and by the same amount within a factor of two.
    moved_hook = planted_hook - base_hook
    moved_outside = planted_diff - base_diff
    assert moved_outside > 0 and moved_hook > 0, (moved_hook, moved_outside)
    assert 0.5 <= moved_hook / moved_outside <= 2.0, (moved_hook, moved_outside, base_hook, planted_hook)
    assert planted_hook <= planted_diff + 50.0 + 0.25 * planted_plain, (planted_hook, planted_diff)
