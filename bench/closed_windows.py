"""What the Python benchmarks share: an SDK-shaped profiler config whose every window is
configured but never open during a run (they start at step FAR), and the percentile they
report. Imported from the benchmarks' own folder, which Python puts first on sys.path."""

import json
import os

FAR = 1_000_000_000  # every window starts here: configured, never open during the run


def write_config(tmp, name, **extra):
    """Writes the config with LocalPath <tmp>/<name> (plus any extra ProfilingParameters)
    to <tmp>/<name>.json; returns (config path, LocalPath)."""
    root = os.path.join(tmp, name)
    window = '{"StartStep": %d, "NumSteps": 1, }' % FAR
    params = {
        "LocalPath": root,
        "RotateMaxFileSizeInBytes": "10485760",
        "RotateFileCloseIntervalInSeconds": "60",
        **extra,
        "DetailedProfilingConfig": window,
        "DataloaderProfilingConfig": '{"StartStep": %d, "NumSteps": 1, "MetricsRegex": ".*", }' % FAR,
        "PythonProfilingConfig": '{"StartStep": %d, "NumSteps": 1, "ProfilerName": "cprofile", '
        '"cProfileTimer": "total_time", }' % FAR,
        "HorovodProfilingConfig": window,
        "SMDataParallelProfilingConfig": window,
    }
    config = {"DisableProfiler": False, "ProfilingIntervalInMilliseconds": 500, "ProfilingParameters": params}
    path = os.path.join(tmp, name + ".json")
    with open(path, "w") as f:
        json.dump(config, f)
    return path, root


def pct(values, q):
    """The q-quantile (0..1) of values, nearest rank."""
    s = sorted(values)
    return s[min(len(s) - 1, int(q * len(s)))]
