"""`trainprof report` on PyTorch memory snapshots (docs/report.md, "Memory"; docs/formats.md,
"Memory snapshots"): synthetic snapshots in the format torch writes (`_snapshot()`'s dict,
pickled by Python's own `pickle` at protocols 2 to 5), with known allocations planted: the peak,
the frames holding memory at the peak, the leak finding against the rank's steps. Hostile pickles
(a GLOBAL/REDUCE that would run code) are refused with the reason and never executed."""

import json
import os
import pickle
import subprocess

T0 = 1_795_400_000_000_000  # epoch µs
STEP_US = 100_000
MIB = 1 << 20
NODE = "0-host"


def run(trainprof_bin, *args):
    proc = subprocess.run([str(trainprof_bin), *map(str, args)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    return proc


def write_timeline(root, steps):
    out = [
        {"name": "process_name", "ph": "M", "pid": 0, "args": {"start_time_since_epoch_in_micros": T0}},
        {"name": "process_name", "ph": "M", "pid": 1, "args": {"name": "Step:ModeKeys.TRAIN"}},
    ]
    for i in range(steps):
        out.append({"name": "Step:ModeKeys.TRAIN", "pid": 1, "ph": "X", "ts": i * STEP_US, "dur": STEP_US - 100,
                    "args": {"step_num": str(i)}})
    d = root / "framework" / "pevents" / "2026112203"
    d.mkdir(parents=True, exist_ok=True)
    (d / f"{T0 + steps * STEP_US}_{NODE}_pythontimeline.json").write_text(json.dumps(out))


def frames(file, line, name):
    # Innermost first, as torch records them: torch's own frame, then the user's.
    return [{"filename": "/usr/lib/python3.11/site-packages/torch/nn/modules/linear.py", "line": 125, "name": "forward"},
            {"filename": file, "line": line, "name": name}]


def leaky_snapshot(steps):
    """Each step: a 64 MiB activation allocated and freed at train.py:20, and 4 MiB kept for
    ever at train.py:30 (the leak). Weights: 100 MiB at model.py:5, allocated before the history."""
    trace, t, addr = [], T0 + 1000, 1 << 40
    weights = {"address": 1 << 30, "size": 100 * MIB, "requested_size": 100 * MIB, "state": "active_allocated",
               "frames": frames("/job/model.py", 5, "__init__")}
    kept = []
    for s in range(steps):
        t = T0 + s * STEP_US + 1000
        act = addr
        addr += 64 * MIB
        trace.append({"action": "alloc", "addr": act, "size": 64 * MIB, "stream": 0, "time_us": t,
                      "frames": frames("/job/train.py", 20, "step")})
        leak = addr
        addr += 4 * MIB
        trace.append({"action": "alloc", "addr": leak, "size": 4 * MIB, "stream": 0, "time_us": t + 10,
                      "frames": frames("/job/train.py", 30, "remember")})
        kept.append(leak)
        trace.append({"action": "free_requested", "addr": act, "size": 64 * MIB, "stream": 0, "time_us": t + 50_000,
                      "frames": []})
        trace.append({"action": "free_completed", "addr": act, "size": 64 * MIB, "stream": 0, "time_us": t + 50_001,
                      "frames": []})
    blocks = [weights] + [{"address": a, "size": 4 * MIB, "requested_size": 4 * MIB, "state": "active_allocated",
                           "frames": frames("/job/train.py", 30, "remember")} for a in kept]
    blocks.append({"address": addr, "size": 50 * MIB, "requested_size": 0, "state": "inactive", "frames": []})
    total = sum(b["size"] for b in blocks)
    seg = {"device": 0, "address": 1 << 30, "total_size": total, "stream": 0, "segment_type": "large",
           "segment_pool_id": (0, 0), "allocated_size": total - 50 * MIB, "active_size": total - 50 * MIB,
           "requested_size": total - 50 * MIB, "blocks": blocks}
    return {"segments": [seg], "device_traces": [trace], "allocator_settings": {}, "external_annotations": []}


def write_snapshot(root, name, data, protocol=None):
    d = root / "framework" / "memory" / NODE
    d.mkdir(parents=True, exist_ok=True)
    (d / name).write_bytes(data if isinstance(data, bytes) else pickle.dumps(data, protocol))


def test_peak_top_frames_and_leak(tmp_path, trainprof_bin):
    steps = 6
    write_timeline(tmp_path, steps)
    snap = leaky_snapshot(steps)
    for proto in (2, 3, 4, 5):
        write_snapshot(tmp_path, f"window-0-{steps - 1}-{T0 + proto}.pickle", snap, proto)
    page = tmp_path / "page.html"
    out = json.loads(run(trainprof_bin, "report", tmp_path, "--json", "-o", page).stdout)
    snaps = out["memory"]["snapshots"]
    assert len(snaps) == 4, out["job"]["skipped"]
    for s in snaps:
        assert s["kind"] == "window" and s["node"] == NODE
        (d,) = s["devices"]
        # The peak: weights + 6 leaked 4 MiB + the last step's 64 MiB activation.
        assert d["peak_allocated_bytes"] == (100 + 4 * steps + 64) * MIB
        assert d["allocated_bytes"] == (100 + 4 * steps) * MIB
        assert d["reserved_bytes"] == (100 + 4 * steps + 50) * MIB
        top = {(r["file"], r["line"]): (r["bytes"], r["count"]) for r in d["top"]}
        assert top[("/job/model.py", 5)] == (100 * MIB, 1)
        assert top[("/job/train.py", 20)] == (64 * MIB, 1)
        assert top[("/job/train.py", 30)] == (4 * steps * MIB, steps)
        leak = d["leak"]
        assert leak is not None
        assert leak["per_step_bytes"] == 4 * MIB
        assert leak["sites"][0]["file"] == "/job/train.py" and leak["sites"][0]["line"] == 30
        assert len(d["chart"]) >= 2
    text = page.read_text()
    assert 'id="memory-snapshots"' in text and "Memory grows step over step" in text and "pytorch.org/memory_viz" in text
    # The leak as a finding, beside GPUMemoryIncrease.
    rules = [f["rule"] for f in out["findings"]]
    assert rules.index("GPUMemoryLeak") == rules.index("GPUMemoryIncrease") + 1
    (f,) = [f for f in out["findings"] if f["rule"] == "GPUMemoryLeak"]
    assert f["triggered"] and f["evaluated"], f
    assert f["evidence"]["devices_judged"] == 4
    assert len(f["evidence"]["leaks"]) == 4
    row = f["evidence"]["leaks"][0]
    assert row["per_step_bytes"] == 4 * MIB and row["site"] == "/job/train.py:30 remember", row
    assert "most of it allocated at /job/train.py:30 remember" in f["summary"]


def test_no_leak_when_memory_is_flat(tmp_path, trainprof_bin):
    steps = 6
    write_timeline(tmp_path, steps)
    snap = leaky_snapshot(steps)
    # Without the kept allocations: flat at each step start.
    snap["device_traces"][0] = [e for e in snap["device_traces"][0] if e["size"] != 4 * MIB]
    snap["segments"][0]["blocks"] = [b for b in snap["segments"][0]["blocks"] if b["size"] != 4 * MIB]
    write_snapshot(tmp_path, f"oom-3-{T0}.pickle", snap)
    out = json.loads(run(trainprof_bin, "report", tmp_path, "--json", "-o", tmp_path / "p.html").stdout)
    (s,) = out["memory"]["snapshots"]
    assert s["kind"] == "oom" and s["first_step"] == 3
    (d,) = s["devices"]
    assert d["peak_allocated_bytes"] == 164 * MIB
    assert d["leak"] is None
    (f,) = [f for f in out["findings"] if f["rule"] == "GPUMemoryLeak"]
    assert f["evaluated"] and not f["triggered"], f
    assert f["evidence"]["devices_judged"] == 1 and f["evidence"]["leaks"] == []


class Boom:
    def __reduce__(self):
        return (os.system, ("touch PWNED",))


def test_hostile_pickles_are_refused_never_run(tmp_path, trainprof_bin):
    write_timeline(tmp_path, 3)
    marker = tmp_path / "PWNED"
    write_snapshot(tmp_path, f"window-0-1-{T0}.pickle", pickle.dumps({"segments": [Boom()], "device_traces": []}))
    write_snapshot(tmp_path, f"window-0-1-{T0 + 1}.pickle", pickle.dumps(leaky_snapshot(3))[:-40])
    deep = []
    for _ in range(200):
        deep = [deep]
    write_snapshot(tmp_path, f"window-0-1-{T0 + 2}.pickle", pickle.dumps({"segments": deep, "device_traces": []}))
    proc = subprocess.run([str(trainprof_bin), "report", tmp_path, "--json", "-o", tmp_path / "p.html"],
                          capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["memory"]["snapshots"] == []
    skipped = "\n".join(out["job"]["skipped"])
    assert "STACK_GLOBAL" in skipped and "never runs" in skipped
    assert "ends early" in skipped
    assert "nest deeper than 64" in skipped
    assert not marker.exists()


def test_memory_events_of_a_detailed_window(tmp_path, trainprof_bin):
    """The detailed windows' memory events (docs/formats.md, "Memory events"), as the hook
    writes torch's `[memory]` events: per device and window, the peak and a chart."""
    steps = 6
    write_timeline(tmp_path, steps)
    out = [
        {"name": "process_name", "ph": "M", "pid": 0, "args": {"start_time_since_epoch_in_micros": T0}},
        {"name": "process_name", "ph": "M", "pid": 7, "args": {"name": "trainprof:Memory"}},
    ]
    # Window of steps 2-3 on the CPU: 1 MiB, +16 MiB, +32 MiB (peak 49 MiB in step 3), frees;
    # cuda:0 in step 2 peaks at 5 MiB; a second CPU window in step 5 peaks at 2 MiB.
    cpu = [(2, 1 * MIB), (2, 17 * MIB), (3, 49 * MIB), (3, 17 * MIB), (3, 1 * MIB)]
    for k, (step, total) in enumerate(cpu):
        out.append({"name": "[memory]", "pid": 7, "ph": "X", "ts": step * STEP_US + 10 * k, "dur": 0,
                    "args": {"step_num": str(step), "Device Type": 0, "Device Id": -1, "Total Allocated": total,
                             "Total Reserved": 0}})
    out.append({"name": "[memory]", "pid": 7, "ph": "X", "ts": 2 * STEP_US + 5, "dur": 0,
                "args": {"step_num": "2", "Device Type": 1, "Device Id": 0, "Total Allocated": 5 * MIB,
                         "Total Reserved": 20 * MIB}})
    out.append({"name": "[memory]", "pid": 7, "ph": "X", "ts": 5 * STEP_US + 1, "dur": 0,
                "args": {"step_num": "5", "Device Type": 0, "Device Id": -1, "Total Allocated": 2 * MIB,
                         "Total Reserved": 0}})
    d = tmp_path / "framework" / "pevents" / "2026112203"
    (d / f"{T0 + steps * STEP_US + 1}_{NODE}_pythontimeline.json").write_text(json.dumps(out))
    page = tmp_path / "page.html"
    got = json.loads(run(trainprof_bin, "report", tmp_path, "--json", "-o", page).stdout)
    ws = [(w["device"], w["first_step"], w["last_step"], w["peak_allocated_bytes"], w["peak_step"], w["events"])
          for w in got["memory"]["windows"]]
    assert ws == [("cpu", 2, 3, 49 * MIB, 3, 5), ("cpu", 5, 5, 2 * MIB, 5, 1), ("cuda:0", 2, 2, 5 * MIB, 2, 1)]
    w = got["memory"]["windows"][0]
    assert w["peak_s"] == (T0 + 3 * STEP_US + 20) / 1e6
    assert max(p[1] for p in w["chart"]) == 49 * MIB
    assert got["memory"]["windows"][2]["peak_reserved_bytes"] == 20 * MIB
    # Not a phase of its own among the job's phases.
    assert all(p["name"] != "trainprof:Memory" for p in got.get("phases", []))
    text = page.read_text()
    assert "Over the detailed windows" in text and "49.0 MiB" in text
    # A chart for the window of more than one event.
    assert text.count('aria-label="allocated memory over the ' + NODE + " cpu, steps 2–3") == 1


def write_trainer_gpu_memory(root, node, seconds, device="device0", value=1000 * MIB):
    """The agent's system lines of the trainer's GPU memory (docs/formats.md, "GPU: the
    trainer's processes") on `node`, one tick at each epoch second given."""
    lines = [json.dumps({"Type": "accelerator", "Name": device, "Dimension": "TrainerMemUsedBytes", "Value": value,
                         "NodeId": node, "Timestamp": t}) for t in seconds]
    minute = seconds[0] - seconds[0] % 60
    d = root / "system" / "incremental" / "2026112203"
    d.mkdir(parents=True, exist_ok=True)
    (d / f"{minute}.{node}.json").write_text("\n".join(lines) + "\n")


def test_what_a_snapshot_cannot_see_against_the_agent(tmp_path, trainprof_bin):
    """The agent's per-process GPU memory on the snapshot's GPU near its peak, and the memory
    outside the caching allocator (docs/report.md, "What a snapshot cannot see")."""
    steps = 6
    t0_s = T0 // 1_000_000
    for case, node, device, seconds in (("near", "host", "device0", [t0_s - 1, t0_s, t0_s + 1, t0_s + 2]),
                                        ("far", "host", "device0", [t0_s + 60]),
                                        ("other-gpu", "host", "device1", [t0_s, t0_s + 1]),
                                        ("other-host", "elsewhere", "device0", [t0_s, t0_s + 1])):
        root = tmp_path / case
        write_timeline(root, steps)
        write_snapshot(root, f"window-0-{steps - 1}-{T0}.pickle", leaky_snapshot(steps))
        write_trainer_gpu_memory(root, node, seconds, device)
        page = root / "page.html"
        out = json.loads(run(trainprof_bin, "report", root, "--json", "-o", page).stdout)
        (s,) = out["memory"]["snapshots"]
        (d,) = s["devices"]
        text = page.read_text()
        if case != "near":
            assert d["agent"] is None, (case, d["agent"])
            assert "No reading of the trainer" in text
            continue
        a = d["agent"]
        assert (a["node"], a["gpu"], a["trainer_bytes"]) == ("host", "gpu0", 1000 * MIB), a
        # The tick nearest the peak (0.5 s after T0).
        assert abs(a["at_s"] - d["peak_s"]) <= 1 and a["at_s"] == t0_s + 1
        assert a["reserved_bytes"] == d["peak_allocated_bytes"] + d["fragmentation_bytes"]
        assert a["outside_bytes"] == 1000 * MIB - a["reserved_bytes"] > 0
        assert "outside the caching allocator</b>" in text and "NCCL" in text
