"""Differential test: trainprof's window resolution against smdebug 1.0.34's own parser.

Each case is a profiler config file. smdebug's ProfilerConfigParser reads it and answers
should_save_metrics() for steps 0..N-1; `trainprof config check --json --steps N` answers
for the same file. Active steps must be identical; `enabled` must be identical except
for the documented differences listed with each case.
"""

import json
import subprocess

import pytest
from smdebug.profiler.profiler_config_parser import MetricsCategory, ProfilerConfigParser

N = 16
FEATURES = {
    "detailed": ("DetailedProfilingConfig", MetricsCategory.DETAILED_PROFILING),
    "dataloader": ("DataloaderProfilingConfig", MetricsCategory.DATALOADER_PROFILING),
    "python": ("PythonProfilingConfig", MetricsCategory.PYTHON_PROFILING),
    "smdataparallel": ("SMDataParallelProfilingConfig", MetricsCategory.SMDATAPARALLEL_PROFILING),
}

# Sub-config strings, each placed under every feature. The second item lists the features
# where trainprof's `enabled` deliberately differs from smdebug's (with the reason).
STEP_CASES = [
    ('{"StartStep": 5, "NumSteps": 1, }', {}),  # SDK default shape
    ("{'StartStep': 3, 'NumSteps': 2}", {}),  # Python str(dict)
    ('{"StartStep": 2}', {}),
    ('{"StartStep": 0}', {}),  # zero counts as absent: never active
    ('{"StartStep": 0, "NumSteps": 2}', {}),
    ('{"NumSteps": 2}', {}),  # start resolved at step 0
    ('{"NumSteps": 0}', {}),
    ('{"StartStep": 5, "NumSteps": 0}', {}),  # empty window
    ('{"StartStep": "4", "NumSteps": "3"}', {}),  # quoted numbers
    ('{"StartStep": 2.9, "NumSteps": 2}', {}),  # int(2.9) == 2
    ('{"StartStep": 1, "DurationInSeconds": 3}', {}),  # step and time: off
    ('{"StartStep": "None"}', {}),  # not an int: off
    ('{"StartStep": "2.5"}', {}),  # int("2.5") fails: off
    ('{"StartStep": 14, "NumSteps": 10}', {}),  # runs past N
    ('{"MetricsRegex": ".*", "ProfilerName": "cprofile"}', {}),  # no range: enabled, never active
    ("{}", {}),
    ("[1, 2]", {}),  # not a dict: off in both
    ('{"StartStep": -1, "NumSteps": 3}', {}),  # Python arithmetic: steps -1, 0, 1
    ('{"StartStep": 4, "NumSteps": -2}', {}),
]

PYTHON_CASES = [
    '{"StartStep": 9, "NumSteps": 3, "ProfilerName": "cprofile", "cProfileTimer": "default", }',
    '{"StartStep": 2, "NumSteps": 2, "ProfilerName": "pyinstrument", }',
    '{"StartStep": 2, "NumSteps": 2, "ProfilerName": "yappi"}',
    '{"StartStep": 2, "NumSteps": 2, "cProfileTimer": "wall_clock"}',
    '{"StartStep": 2, "NumSteps": 2, "ProfilerName": "CPROFILE", "cProfileTimer": "CPU_TIME"}',
]

DATALOADER_CASES = [
    '{"StartStep": 7, "NumSteps": 1, "MetricsRegex": ".*", }',
    '{"StartStep": 3, "MetricsRegex": "*"}',  # invalid regex: off in both
    '{"StartStep": 3, "MetricsRegex": "DataLoaderIter"}',
]


def smdebug_view(path, monkeypatch):
    monkeypatch.setenv("SMPROFILER_CONFIG_PATH", str(path))
    parser = ProfilerConfigParser()
    out = {}
    for name, (_, category) in FEATURES.items():
        if not parser.profiling_enabled:
            out[name] = (False, [])
            continue
        cfg = getattr(parser.config, f"{name}_profiling_config")
        enabled = cfg.is_enabled()
        active = [s for s in range(N) if parser.should_save_metrics(category, s, current_time=1e9)]
        out[name] = (enabled, active)
    return out


def trainprof_view(path, trainprof_bin):
    proc = subprocess.run(
        [str(trainprof_bin), "config", "check", "--json", "--steps", str(N), str(path)],
        capture_output=True,
        text=True,
        check=False,
        env={"PATH": "/usr/bin:/bin"},
    )
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    return {
        name: (doc["features"][name]["enabled"], doc["features"][name]["active_steps"])
        for name in FEATURES
    }


def write_config(tmp_path, subconfigs, top=None):
    params = {"LocalPath": str(tmp_path / "out")}
    params.update(subconfigs)
    doc = dict(top or {})
    doc["ProfilingParameters"] = params
    path = tmp_path / "profilerconfig.json"
    path.write_text(json.dumps(doc))
    return path


def compare(path, trainprof_bin, monkeypatch, differs=None):
    differs = differs or {}
    ours = trainprof_view(path, trainprof_bin)
    theirs = smdebug_view(path, monkeypatch)
    for name in FEATURES:
        assert ours[name][1] == theirs[name][1], f"{name}: active steps {ours[name][1]} != smdebug {theirs[name][1]}"
        if name in differs:
            assert ours[name][0] != theirs[name][0], f"{name}: expected the documented difference: {differs[name]}"
        else:
            assert ours[name][0] == theirs[name][0], f"{name}: enabled {ours[name][0]} != smdebug {theirs[name][0]}"


@pytest.mark.parametrize("sub,differs", STEP_CASES, ids=[c[0] for c in STEP_CASES])
def test_step_windows_match_smdebug(sub, differs, tmp_path, trainprof_bin, monkeypatch):
    path = write_config(tmp_path, {key: sub for key, _ in FEATURES.values()})
    compare(path, trainprof_bin, monkeypatch, differs)


@pytest.mark.parametrize("sub", PYTHON_CASES)
def test_python_configs_match_smdebug(sub, tmp_path, trainprof_bin, monkeypatch):
    path = write_config(tmp_path, {"PythonProfilingConfig": sub})
    compare(path, trainprof_bin, monkeypatch)


@pytest.mark.parametrize("sub", DATALOADER_CASES)
def test_dataloader_configs_match_smdebug(sub, tmp_path, trainprof_bin, monkeypatch):
    path = write_config(tmp_path, {"DataloaderProfilingConfig": sub})
    compare(path, trainprof_bin, monkeypatch)


def test_sdk_default_framework_profile_matches_smdebug(tmp_path, trainprof_bin, monkeypatch):
    path = write_config(
        tmp_path,
        {
            "DetailedProfilingConfig": '{"StartStep": 5, "NumSteps": 1, }',
            "DataloaderProfilingConfig": '{"StartStep": 7, "NumSteps": 1, "MetricsRegex": ".*", }',
            "PythonProfilingConfig": '{"StartStep": 9, "NumSteps": 3, "ProfilerName": "cprofile", "cProfileTimer": "default", }',
            "HorovodProfilingConfig": '{"StartStep": 13, "NumSteps": 1, }',
            "SMDataParallelProfilingConfig": '{"StartStep": 15, "NumSteps": 1, }',
        },
        top={"DisableProfiler": False, "ProfilingIntervalInMilliseconds": 500},
    )
    compare(path, trainprof_bin, monkeypatch)
    assert trainprof_view(path, trainprof_bin)["python"] == (True, [9, 10, 11])


def test_disable_profiler_matches_smdebug(tmp_path, trainprof_bin, monkeypatch):
    path = write_config(
        tmp_path, {"DetailedProfilingConfig": '{"StartStep": 1, }'}, top={"DisableProfiler": True}
    )
    compare(path, trainprof_bin, monkeypatch)
    assert trainprof_view(path, trainprof_bin)["detailed"] == (False, [])


def test_sdk_duration_is_a_documented_difference(tmp_path, trainprof_bin, monkeypatch):
    """The SDK writes `Duration`; smdebug ignores it, trainprof reads it (docs/configuration.md)."""
    path = write_config(tmp_path, {"DetailedProfilingConfig": '{"Duration": 30, }'})
    assert smdebug_view(path, monkeypatch)["detailed"] == (True, [])  # no range: never active
    proc = subprocess.run(
        [str(trainprof_bin), "config", "check", "--json", str(path)], capture_output=True, text=True, check=True
    )
    assert json.loads(proc.stdout)["features"]["detailed"]["duration_s"] == 30.0


@pytest.mark.parametrize(
    "framework, detailed, python",
    [
        (None, "steps 3–4 (PyTorch: global steps, every mode; TensorFlow: train steps)",
         "steps 9–11 (PyTorch: global steps, every mode; TensorFlow: each mode's own steps), cProfile, total_time"),
        ("pytorch", "global steps 3–4 (every mode, PyTorch)",
         "global steps 9–11 (every mode, PyTorch), cProfile, total_time"),
        ("tensorflow", "train steps 3–4 (TensorFlow)",
         "steps 9–11 (each mode's own steps, TensorFlow), cProfile, total_time"),
    ],
)
def test_config_check_says_which_steps_each_framework_counts(
    tmp_path, trainprof_bin, monkeypatch, framework, detailed, python
):
    """smdebug's PyTorch hook tests every window at its global step (every mode counted
    together); its Keras callback the detailed window at train steps and the others at each
    mode's own step. `config check --framework` says which; without it, both. The step
    numbers themselves are smdebug's parser's, whichever the framework."""
    path = write_config(tmp_path, {
        "DetailedProfilingConfig": json.dumps({"StartStep": 3, "NumSteps": 2}),
        "PythonProfilingConfig": json.dumps({"StartStep": 9, "NumSteps": 3}),
    })
    flag = ["--framework", framework] if framework else []
    text = subprocess.run([str(trainprof_bin), "config", "check", str(path)] + flag, capture_output=True,
                          text=True, check=True, env={"PATH": "/usr/bin:/bin"}).stdout
    assert f"detailed: {detailed}" in text.splitlines(), text
    assert f"python: {python}" in text.splitlines(), text
    doc = json.loads(subprocess.run([str(trainprof_bin), "config", "check", "--json", "--steps", str(N), str(path)]
                                    + flag, capture_output=True, text=True, check=True,
                                    env={"PATH": "/usr/bin:/bin"}).stdout)
    assert doc["framework"] == framework
    assert doc["features"]["detailed"]["steps_counted"] == {"pytorch": "global", "tensorflow": "train"}
    assert doc["features"]["python"]["steps_counted"] == {"pytorch": "global", "tensorflow": "each_mode"}
    theirs = smdebug_view(path, monkeypatch)
    assert doc["features"]["detailed"]["active_steps"] == theirs["detailed"][1] == [3, 4]
