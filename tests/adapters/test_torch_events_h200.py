"""trainprof.torch's kernel args (docs/formats.md, "Event vocabulary") from the events torch
2.11 gave on a real H200 (tests/fixtures/torch-events-h200): each kernel, memset and memcpy
finds its launch call by its correlation id, with its stream, although torch 2.11's
FunctionEvent has no linked_correlation_id and an operator's id can alias a kernel's."""

import json
import pathlib
import sys
import types

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "hook-ffi" / "python"))

from trainprof import _caps  # noqa: E402
from trainprof.torch import TorchHook  # noqa: E402

FIXTURE = ROOT / "tests" / "fixtures" / "torch-events-h200" / "events.json"


def function_events():
    """The probe's events as objects with the attributes torch 2.11 gave (none where it had none)."""
    out = []
    for e in json.loads(FIXTURE.read_text())["events"]:
        o = types.SimpleNamespace()
        for k, v in e.items():
            if v != "<missing>" and k not in ("start_us", "end_us", "cpu_parent", "kernels", "device_type"):
                setattr(o, k, v)
        o.device_type = types.SimpleNamespace(name=e["device_type"].rsplit(".", 1)[-1])
        o.time_range = types.SimpleNamespace(start=e["start_us"], end=e["end_us"])
        out.append(o)
    return out


def test_every_device_event_of_a_real_h200_trace_finds_its_launch_and_stream():
    events = function_events()
    assert not any(hasattr(e, "linked_correlation_id") for e in events)  # torch 2.11
    recorded = []
    prof = types.SimpleNamespace(
        record_event=lambda phase, name, start, end, step=None, args=None: recorded.append((phase, name, start, args))
    )
    hook = types.SimpleNamespace(_prof=prof, _caps=dict(_caps.DEFAULTS), _window_events=0, _rss_stop=0)
    TorchHook._record_ops(hook, events, 1_000_000.0, [(0, 1)])
    launches = {e.id: e for e in events if e.device_type.name == "CPU" and e.name.startswith("cu")}
    gpu = [r for r in recorded if r[0] == "gpu_functions-dev:0"]
    assert len(gpu) == 20
    for phase, name, start, args in gpu:
        assert set(args) == {"device", "stream", "correlation", "cpu_thread_start_time"}, (name, args)
        launch = launches[args["correlation"]]
        assert launch.name.startswith(("cudaLaunchKernel", "cudaMemsetAsync", "cudaMemcpyAsync", "cuLaunch")), launch.name
        assert args["cpu_thread_start_time"] == int(1_000_000.0 + launch.time_range.start) <= start
    # The default stream is 7; the kernel run under torch.cuda.stream(s2) is on another.
    streams = {args["stream"] for *_, args in gpu}
    assert 7 in streams and len(streams) >= 2
    # CPU ops keep their thread only.
    assert all(set(r[3]) == {"tid"} for r in recorded if r[0] == "cpu_functions")
