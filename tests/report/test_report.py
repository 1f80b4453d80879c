"""`trainprof report --json` and `trainprof trace` on jobs with known answers
(docs/report.md): real `trainprof run` around a trainer using the real hook
(tests/report/scripts/trainer.py), the fake libnvidia-ml.so.1 for GPUs, and, for growing GPU
memory (which the fake NVML cannot script), system files written in the documented format.

Each test plants one thing and checks that the report finds exactly it: the finding that
must trigger does, with numbers and time ranges that point at what was planted, and none of
the findings contradicts it. The trace of each job holds every step and every event of every
rank plus counter tracks, and passes the Chrome trace-format checks of the e2e test."""

import collections
import gzip
import json
import os
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
SCRIPTS = ROOT / "tests" / "report" / "scripts"
sys.path.insert(0, str(ROOT / "tests" / "e2e"))

from test_example_end_to_end import chrome_trace_problems  # noqa: E402

RULES = ["CPUBottleneck", "IOBottleneck", "LowGPUUtilization", "GPUMemoryIncrease", "GPUMemoryLeak", "BatchSize",
         "StepOutlier", "Dataloader", "MaxInitializationTime", "LoadBalancing", "OverallSystemUsage"]


def run_job(work, trainprof_bin, hook_lib, package_dir, params, config=None, nvml=None, ranks=None,
            extra_args=()):
    """`trainprof run` around trainer.py (or launch.py with ``ranks``); returns (out, stderr,
    manifests)."""
    out = work / "out"
    pp = {"LocalPath": str(out)}
    for k, v in (config or {}).items():
        pp[k] = json.dumps(v)
    cfg = work / "profilerconfig.json"
    cfg.write_text(json.dumps({"ProfilingParameters": pp}))
    rc = work / "resourceconfig.json"
    rc.write_text(json.dumps({"current_host": "algo-1", "hosts": ["algo-1"]}))
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("TRAINPROF_", "SMPROFILER_", "RANK", "OMPI_", "PMI_", "MV2_", "SLURM_"))}
    env.update(PYTHONPATH=str(package_dir), TRAINPROF_HOOK_LIB=str(hook_lib), TRAINPROF_RESOURCE_CONFIG=str(rc),
               TRAINPROF_TEST_MANIFEST=str(work / "manifest.json"), TRAINPROF_TEST_PARAMS=json.dumps(params))
    # No fake NVML: a machine without GPUs (the library is not there).
    env["TRAINPROF_NVML_LIB"] = str(nvml) if nvml else str(work / "no-libnvidia-ml.so.1")
    script = SCRIPTS / "trainer.py"
    if ranks is not None:
        env["TRAINPROF_TEST_RANKS"] = json.dumps(ranks)
        script = SCRIPTS / "launch.py"
    proc = subprocess.run(
        [str(trainprof_bin), "run", "--config", str(cfg), "--interval-ms", "100", *extra_args, "--",
         sys.executable, str(script)],
        env=env, capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr
    names = [work / "manifest.json"] if ranks is None else [work / f"manifest.json.{i}" for i in range(len(ranks))]
    return out, proc.stderr, [json.loads(p.read_text()) for p in names]


def report_json(trainprof_bin, path, *args):
    proc = subprocess.run([str(trainprof_bin), "report", str(path), "--json", *args],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    model = json.loads(proc.stdout)
    # ProfilingCost comes last when an agent or a hook wrote its cost record (docs/report.md,
    # "What profiling cost"): every job `run` made here has one.
    pc = model["profiling_cost"]
    cost = ["ProfilingCost"] if pc["recorded"] or pc["hook_recorded"] else []
    assert [f["rule"] for f in model["findings"]] == RULES + cost
    assert "series" not in model
    return model


def finding(model, rule):
    return next(f for f in model["findings"] if f["rule"] == rule)


def triggered(model):
    """The rules that judged the training triggered; trainprof's own cost (ProfilingCost,
    judged on a debug build's agent here) is not the job's."""
    return {f["rule"] for f in model["findings"] if f["triggered"] and f["rule"] != "ProfilingCost"}


def timeline_events(out):
    """Every complete event of every timeline file, as (node, phase, name, start µs, dur)."""
    events = []
    for path in sorted((out / "framework" / "pevents").rglob("*_pythontimeline.json")):
        node = path.name.split("_")[1]
        doc = json.loads(path.read_text())
        base = next(e["args"]["start_time_since_epoch_in_micros"] for e in doc
                    if e.get("ph") == "M" and e.get("pid") == 0 and e["name"] == "process_name")
        phases = {e["pid"]: e["args"]["name"] for e in doc
                  if e.get("ph") == "M" and e["name"] == "process_name" and e["pid"] != 0}
        events += [(node, phases[e["pid"]], e["name"], base + e["ts"], e["dur"]) for e in doc if e.get("ph") == "X"]
    return events


def trace(trainprof_bin, out, *args, name="t.json.gz"):
    target = out.parent / name
    proc = subprocess.run([str(trainprof_bin), "trace", str(out), "-o", str(target), *args],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    text = gzip.decompress(target.read_bytes()).decode()
    assert chrome_trace_problems(text) == []
    return json.loads(text)


def trace_slices(doc):
    """(rank, phase, name, ts, dur) of every slice, with the process names resolved."""
    procs = {e["pid"]: e["args"]["name"] for e in doc if e["ph"] == "M" and e["name"] == "process_name"}
    return [(procs[e["pid"]].removeprefix("rank "), e["cat"], e["name"], e["ts"], e["dur"])
            for e in doc if e["ph"] == "X" and e["cat"] != "python"]


def check_trace_holds_everything(trainprof_bin, out, counters):
    doc = trace(trainprof_bin, out)
    assert sorted(trace_slices(doc)) == sorted(timeline_events(out))
    names = {e["name"] for e in doc if e["ph"] == "C"}
    assert counters <= names, names
    procs = {e["args"]["name"] for e in doc if e["ph"] == "M" and e["name"] == "process_name"}
    assert "node algo-1" in procs
    return doc


def test_slow_steps_are_step_outliers(tmp_path, trainprof_bin, hook_lib, package_dir):
    """150 steps of 5 ms with 11 of 400 ms: StepOutlier needs more than 10 outliers among more
    than 100 steps (SageMaker's defaults); the outliers are exactly the planted steps."""
    slow = {str(s): 400 for s in (20, 31, 42, 53, 64, 75, 86, 97, 108, 119, 130)}
    out, stderr, [m] = run_job(tmp_path, trainprof_bin, hook_lib, package_dir, {"steps": 150, "slow": slow})
    model = report_json(trainprof_bin, out, "--patience", "10")
    steps = model["steps"]["TRAIN"]
    assert model["job"]["steps_per_mode"] == {"TRAIN": 150}
    assert steps["count"] == 150 and model["job"]["ranks"] == [m["node_id"]]
    assert sorted(o["step"] for o in steps["outliers"]) == sorted(int(s) for s in slow)
    assert steps["max_ms"] >= 400 and steps["p50_ms"] < 100
    assert steps["stragglers"] == []
    f = finding(model, "StepOutlier")
    assert f["triggered"] and f["evaluated"] and f["advice"]
    assert len(f["ranges"]) == len(slow)
    starts = {o["step"]: o["start_s"] for o in steps["outliers"]}
    for s in slow:
        planted = next(x for x in m["steps"] if x["step"] == int(s))
        assert abs(starts[int(s)] - planted["start"]) < 0.05
    # No GPU on this machine: the GPU rules are not evaluated, nothing else triggers.
    for rule in ("CPUBottleneck", "IOBottleneck", "LowGPUUtilization", "GPUMemoryIncrease", "BatchSize",
                 "LoadBalancing"):
        assert not finding(model, rule)["evaluated"], rule
    assert triggered(model) == {"StepOutlier"}
    # The end of `run` wrote the page and named the finding.
    assert (out / "report.html").is_file()
    assert f"report: {out / 'report.html'}" in stderr
    assert "finding: StepOutlier:" in stderr
    # The page is never replaced.
    before = (out / "report.html").read_bytes()
    proc = subprocess.run([str(trainprof_bin), "report", str(out)], capture_output=True, text=True)
    assert proc.returncode == 1 and "exists: not replaced" in proc.stderr
    assert (out / "report.html").read_bytes() == before
    doc = check_trace_holds_everything(trainprof_bin, out, {"CPU total %", "Memory used %"})
    # Clipped to steps 40-60: those steps are there, the first and last are not.
    clipped = trace(trainprof_bin, out, "--steps", "40-60", name="clip.json.gz")
    got = {int(e["args"]["step_num"]) for e in clipped if e["ph"] == "X" and e["cat"] == "Step:ModeKeys.TRAIN"}
    assert set(range(40, 61)) <= got <= set(range(39, 62)), got
    assert len(clipped) < len(doc)
    # A second job into the same LocalPath: its own page, beside the first, on its own files
    # (20 plain steps: no StepOutlier, though the first job's slow steps are still there).
    _, stderr2, _ = run_job(tmp_path, trainprof_bin, hook_lib, package_dir, {"steps": 20})
    assert f"report: {out / 'report-2.html'}" in stderr2
    assert "finding: StepOutlier" not in stderr2
    assert (out / "report.html").read_bytes() == before


def test_cpu_burner_with_idle_gpu(tmp_path, trainprof_bin, hook_lib, package_dir, fake_nvml):
    """Two processes burn both cores while the fake NVML's second GPU idles at 3 %:
    CPUBottleneck. The fake GPUs are 87 % and 3 % busy with constant memory: the idle one is
    LowGPUUtilization, the pair LoadBalancing; memory does not grow and the CPU is busy, so
    GPUMemoryIncrease and BatchSize stay quiet."""
    out, _, [m] = run_job(tmp_path, trainprof_bin, hook_lib, package_dir,
                          {"steps": 40, "step_ms": 50, "burn_procs": 2, "burn_s": 1}, nvml=fake_nvml)
    model = report_json(trainprof_bin, out, "--patience", "10")
    f = finding(model, "CPUBottleneck")
    assert f["triggered"], f
    node = f["evidence"]["nodes"]["algo-1"]
    assert node["percent"] > 50 and node["bottlenecks"] <= node["datapoints"]
    assert f["ranges"] and all(a <= b for a, b in f["ranges"])
    low = finding(model, "LowGPUUtilization")
    assert low["triggered"] and "gpu1" in low["summary"] and "gpu0" not in low["summary"]
    issues = {g["gpu"]: g["issue"] for g in low["evidence"]["gpus"]}
    assert issues == {"gpu0": None, "gpu1": "underutilized"}
    assert finding(model, "LoadBalancing")["triggered"]
    assert finding(model, "GPUMemoryIncrease")["evaluated"] and not finding(model, "GPUMemoryIncrease")["triggered"]
    assert not finding(model, "BatchSize")["triggered"]
    assert finding(model, "OverallSystemUsage")["evaluated"]
    assert triggered(model) == {"CPUBottleneck", "LowGPUUtilization", "LoadBalancing"}
    check_trace_holds_everything(trainprof_bin, out, {"CPU total %", "gpu0 util %", "gpu1 memory %", "Trainer CPU % (of one core)"})


def write_system_files(out, ticks, start=1795400000, node="algo-1"):
    """System files in the documented line format, one file per minute: ``ticks`` is a list
    of (cpu %, gpu util %, gpu memory %), one per second."""
    files = collections.defaultdict(list)
    for i, (cpu, util, mem) in enumerate(ticks):
        t = start + i
        minute = t - t % 60
        for name, typ, dim, v in (("cpu0", "cpu", "CPUUtilization", cpu), ("cpu1", "cpu", "CPUUtilization", cpu),
                                  ("gpu0", "gpu", "GPUUtilization", util), ("gpu0", "gpu", "GPUMemoryUtilization", mem),
                                  ("MemoryUsedPercent", "memory", "", 30)):
            files[minute].append(json.dumps({"Type": typ, "Name": name, "Dimension": dim, "Value": v,
                                             "NodeId": node, "Timestamp": t}, separators=(",", ":")))
    import time as _t
    for minute, lines in files.items():
        hour = _t.strftime("%Y%m%d%H", _t.gmtime(minute))
        d = out / "system" / "incremental" / hour
        d.mkdir(parents=True, exist_ok=True)
        (d / f"{minute}.{node}.json").write_text("\n".join(lines) + "\n")


def test_growing_gpu_memory(tmp_path, trainprof_bin, s3):
    """1200 one-second ticks (more than SageMaker's patience of 1000, so no --patience) with
    GPU memory stepping up by 40 points at tick 1100 (SageMaker's moving averages, 10
    values against the 9 before the last two, rise by at most about a fifth of a step) and a busy GPU: GPUMemoryIncrease, with
    the range at the step; the same from S3."""
    out = tmp_path / "out"
    ticks = [(40, 80, 20 if i < 1100 else 60 + (i - 1100) * 0.2) for i in range(1200)]
    write_system_files(out, ticks)
    model = report_json(trainprof_bin, out)
    f = finding(model, "GPUMemoryIncrease")
    assert f["triggered"], f
    gpu = f["evidence"]["gpus"][0]
    assert gpu["max_increase"] > 5 and gpu["datapoints"] == 1200
    assert all(1795400000 + 1100 <= a <= b <= 1795400000 + 1200 for a, b in f["ranges"]), f["ranges"]
    # GPU busy, CPU at 40 %: nothing else.
    assert triggered(model) == {"GPUMemoryIncrease"}
    assert model["job"]["nodes"] == ["algo-1"] and model["job"]["duration_s"] == 1199
    # The same job from S3.
    for p in out.rglob("*.json"):
        s3.client.upload_file(str(p), s3.bucket, "job/" + str(p.relative_to(out)))
    s3.client.put_object(Bucket=s3.bucket, Key="job/report.html", Body=b"not read")
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    from s3_support import agent_env
    env.update(agent_env(s3.endpoint))
    proc = subprocess.run([str(trainprof_bin), "report", f"s3://{s3.bucket}/job", "--json", "--s3-endpoint",
                           s3.endpoint], capture_output=True, text=True, timeout=120, env=env, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    remote = json.loads(proc.stdout)
    assert remote["source"] == f"s3://{s3.bucket}/job"
    for key in ("job", "steps", "findings"):
        assert remote[key] == model[key], key
    doc = trace(trainprof_bin, out)
    assert sum(1 for e in doc if e["ph"] == "C" and e["name"] == "gpu0 memory %") == 1200


def test_dataloader_and_python_windows(tmp_path, trainprof_bin, hook_lib, package_dir):
    """A dataloader window over steps 2-4 and a cProfile window at step 6: three DataLoaderIter
    events after one DataLoaderIterInitialize (its num_workers and pin_memory in the evidence), and the Python windows' top functions decoded from
    pstats in Rust (the trainer's own function among them)."""
    out, _, [m] = run_job(tmp_path, trainprof_bin, hook_lib, package_dir,
                          {"steps": 10, "step_ms": 20, "dataloader": True},
                          config={"DataloaderProfilingConfig": {"StartStep": 2, "NumSteps": 3},
                                  "PythonProfilingConfig": {"StartStep": 6, "NumSteps": 1}})
    model = report_json(trainprof_bin, out, "--patience", "10")
    assert m["dataloader_steps"] == [2, 3, 4]
    # Three DataLoaderIter events and the one DataLoaderIterInitialize before them.
    assert model["job"]["profiled"]["dataloader_events"] == 4
    phases = {p["name"]: p for p in model["phases"]}
    assert phases["DataLoaderIter"]["count"] == 3 and phases["DataLoaderIterInitialize"]["count"] == 1
    dl = finding(model, "Dataloader")
    assert not dl["triggered"] and not dl["evaluated"]  # less than a second of dataloading
    assert dl["evidence"]["events"] == 4 and dl["evidence"]["pin_memory"] is False
    assert dl["evidence"]["num_workers"] == 0
    windows = {(w["start_step"], w["end_step"]) for w in model["python"]}
    # Pre-step-zero, step 6 to step 7 (no forward_end in this trainer), post-close.
    assert windows == {(None, 0), (6, 7), (None, None)}
    assert model["job"]["profiled"]["python_folders"] == len(model["python"]) == 3
    assert model["job"]["profiled"]["python_windows"] == len(model["python_summary"]["windows"]) == 3
    assert model["job"]["profiled"]["native_windows"] == 0
    step6 = next(w for w in model["python"] if (w["start_step"], w["end_step"]) == (6, 7))
    assert step6["profiler"] == "cprofile"
    known = [f for f in step6["functions"] if f["name"] == "tp_report_known_function"]
    assert known and known[0]["calls"] == 1 and known[0]["total_s"] >= 0.015 and known[0]["file"].endswith("trainer.py")
    assert triggered(model) <= {"CPUBottleneck"}  # whatever else the machine did, nothing planted
    doc = check_trace_holds_everything(trainprof_bin, out, {"CPU total %"})
    assert sum(1 for e in doc if e["ph"] == "X" and e["cat"] == "python") == len(model["python"])


def test_two_ranks_one_slowed(tmp_path, trainprof_bin, hook_lib, package_dir):
    """Two ranks of 30 steps; rank 1 sleeps twice as long: it is the straggler (its median
    step at least 1.2 times the median of the ranks' medians), rank 0 is not."""
    out, _, manifests = run_job(tmp_path, trainprof_bin, hook_lib, package_dir, {"steps": 30, "step_ms": 30},
                                ranks=[{}, {"slow_factor": 2.0}])
    model = report_json(trainprof_bin, out, "--patience", "10")
    assert model["job"]["ranks"] == ["0-algo-1", "1-algo-1"]
    steps = model["steps"]["TRAIN"]
    assert steps["count"] == 60 and set(steps["per_rank"]) == {"0-algo-1", "1-algo-1"}
    assert [s["rank"] for s in steps["stragglers"]] == ["1-algo-1"]
    s = steps["stragglers"][0]
    assert s["ratio"] >= 1.2 and s["p50_ms"] > steps["per_rank"]["0-algo-1"]["p50_ms"] * 1.5
    assert not finding(model, "LoadBalancing")["evaluated"]  # GPUs only; none here
    assert "StepOutlier" not in triggered(model)
    doc = check_trace_holds_everything(trainprof_bin, out, {"CPU total %"})
    per_rank = collections.Counter(r for r, phase, *_ in trace_slices(doc) if phase == "Step:ModeKeys.TRAIN")
    assert per_rank == {"0-algo-1": 30, "1-algo-1": 30}


def test_bad_input_is_refused_clearly(tmp_path, trainprof_bin):
    proc = subprocess.run([str(trainprof_bin), "report", str(tmp_path / "missing"), "--json"],
                          capture_output=True, text=True)
    assert proc.returncode == 2 and "not a folder" in proc.stderr
    (tmp_path / "empty").mkdir()
    proc = subprocess.run([str(trainprof_bin), "report", str(tmp_path / "empty"), "--json"],
                          capture_output=True, text=True)
    assert proc.returncode == 1 and "holds no profiler data" in proc.stderr
    proc = subprocess.run([str(trainprof_bin), "trace", str(tmp_path), "--steps", "9-3"], capture_output=True, text=True)
    assert proc.returncode == 2 and "A <= B" in proc.stderr


def test_planted_links_are_not_followed(tmp_path, trainprof_bin):
    """A timeline and a system folder planted as links to files outside the LocalPath are
    not read (the report runs as root at the end of `run`): they are named in job.skipped,
    and nothing of theirs shows in the statistics."""
    out = tmp_path / "out"
    write_system_files(out, [(10, 50, 20)] * 5)
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "t.json").write_text(json.dumps([
        {"name": "process_name", "ph": "M", "pid": 0, "args": {"start_time_since_epoch_in_micros": 1795400000000000}},
        {"name": "process_name", "ph": "M", "pid": 1, "args": {"name": "Step:ModeKeys.TRAIN"}},
        {"name": "Step:ModeKeys.TRAIN", "pid": 1, "ph": "X", "ts": 0, "dur": 10, "args": {"step_num": "0"}}]))
    hour = out / "framework" / "pevents" / "2026112203"
    hour.mkdir(parents=True)
    (hour / "1795400000000010_0-algo-1_pythontimeline.json").symlink_to(outside / "t.json")
    write_system_files(outside, [(99, 1, 99)] * 5, node="algo-9")
    planted_hour = next((outside / "system" / "incremental").iterdir())
    (out / "system" / "incremental" / "2026112203").symlink_to(planted_hour)
    model = report_json(trainprof_bin, out)
    assert model["steps"] == {} and model["job"]["ranks"] == []
    assert model["job"]["nodes"] == ["algo-1"]
    skipped = "\n".join(model["job"]["skipped"])
    assert skipped.count("symbolic link") == 2, skipped


def clock_rows(out):
    """(node, Name, Value) of every `clock` row of the system files."""
    rows = []
    for path in sorted((out / "system" / "incremental").rglob("*.json")):
        for line in path.read_text().splitlines():
            r = json.loads(line)
            if r["Type"] == "clock":
                rows.append((r["NodeId"], r["Name"], r["Value"]))
    return rows


def test_an_anomaly_trigger_and_the_clock_bound(tmp_path, trainprof_bin, hook_lib, package_dir):
    """A real run with AutoProfilingConfig (as tests/hook/test_auto_profiling.py: steps of 20 ms,
    StepTimeRatio 5) where step 30 takes 400 ms: the report lists exactly that trigger, with
    the numbers of the hook's event, and the trace holds the event on its rank's process. The
    agent's clock rows (real adjtimex) give `job.clock` (the worst reading of the node) and a
    counter track."""
    auto = {"StepTimeRatio": 5, "WarmupSteps": 20, "NumSteps": 2, "Features": ["detailed"]}
    out, stderr, [m] = run_job(tmp_path, trainprof_bin, hook_lib, package_dir,
                               {"steps": 40, "step_ms": 20, "slow": {"30": 400}},
                               config={"AutoProfilingConfig": auto})
    events = []
    for path in sorted((out / "framework" / "pevents").rglob("*_pythontimeline.json")):
        doc = json.loads(path.read_text())
        base = next(e["args"]["start_time_since_epoch_in_micros"] for e in doc
                    if e.get("ph") == "M" and e.get("pid") == 0 and e["name"] == "process_name")
        events += [(path.name.split("_")[1], base, e) for e in doc if e.get("name") == "trainprof:AutoProfilingTrigger"]
    assert len(events) == 1, events
    node, base, ev = events[0]
    model = report_json(trainprof_bin, out)
    (t,) = model["triggers"]
    assert t["rank"] == node == m["node_id"]
    assert t["step"] == 30 and ev["args"]["step"] == 30
    assert t["ms"] == ev["args"]["duration_ms"] and t["ms"] >= 400
    assert t["median_ms"] == ev["args"]["median_ms"] and t["median_ms"] < 100
    assert t["features"] == ["detailed"]
    planted = next(x for x in m["steps"] if x["step"] == 30)
    assert abs(t["start_s"] - planted["start"]) < 0.05
    assert abs(t["start_s"] + t["ms"] / 1000 - (base + ev["ts"]) / 1e6) < 1e-3
    # The page lists it.
    page = (out / "report.html").read_text()
    assert 'id="triggers"' in page
    # The trace: one instant event on the rank's process, with the event's arguments.
    doc = trace(trainprof_bin, out)
    procs = {e["pid"]: e["args"]["name"] for e in doc if e["ph"] == "M" and e["name"] == "process_name"}
    got = [e for e in doc if e["name"] == "trainprof:AutoProfilingTrigger"]
    assert len(got) == 1 and got[0]["ph"] == "i", got
    assert procs[got[0]["pid"]] == f"rank {node}"
    assert got[0]["ts"] == base + ev["ts"] and got[0]["args"] == ev["args"]

    # The clock: the agent's rows, the worst of them in the model.
    rows = clock_rows(out)
    assert rows, "no clock rows: the agent wrote none"
    (c,) = model["job"]["clock"]
    assert c["node"] == "algo-1"
    syncs = [v for n, k, v in rows if k == "Synchronised"]
    assert (c["readings"], c["unsynchronised_readings"]) == (len(syncs), syncs.count(0))
    assert c["synchronised"] == all(v == 1 for v in syncs)
    assert "<h3>Clock</h3>" in page
    if c["synchronised"]:
        assert c["state"] == "synchronised"
        assert c["max_error_us"] == max(v for n, k, v in rows if k == "MaxErrorMicros")
        assert c["est_error_us"] == max(v for n, k, v in rows if k == "EstimatedErrorMicros")
    else:
        # This machine keeps no time daemon: no bound is shown as if it were measured.
        assert c["state"] == "unsynchronised"
        assert c["max_error_us"] is None and c["est_error_us"] is None
        assert "unsynchronised" in page
    # The trace draws the bound of synchronised readings only.
    bound = [e for e in doc if e["ph"] == "C" and e["name"] == "Clock error bound µs"]
    assert len(bound) == sum(1 for v in syncs if v != 0)
    state = [e for e in doc if e["ph"] == "C" and e["name"] == "Clock synchronised"]
    assert [e["args"]["synchronised"] for e in state] == syncs
    assert {procs[e["pid"]] for e in bound + state} == {"node algo-1"}


def write_lines(out, lines, name="1795400000.algo-1.json"):
    d = out / "system" / "incremental" / "2026112203"
    d.mkdir(parents=True, exist_ok=True)
    (d / name).write_text("".join(json.dumps(x, separators=(",", ":")) + "\n" for x in lines))


def sys_line(ty, name, dim, v, t, node="algo-1"):
    return {"Type": ty, "Name": name, "Dimension": dim, "Value": v, "NodeId": node, "Timestamp": t}


def test_an_unsynchronised_clock_is_said_in_words(tmp_path, trainprof_bin):
    """A host without a time daemon: `Synchronised` 0 and the kernel's 16 s ceiling as the
    bound. The model says `unsynchronised` and gives no bound; the page says it in words and
    never prints the 16,000,000 µs as if measured."""
    out = tmp_path / "out"
    lines = []
    for i in range(3):
        t = 1795400000 + 60 * i
        lines += [sys_line("cpu", "cpu0", "CPUUtilization", 10, t),
                  sys_line("clock", "Synchronised", "Kernel", 0, t),
                  sys_line("clock", "MaxErrorMicros", "Kernel", 16000000, t),
                  sys_line("clock", "EstimatedErrorMicros", "Kernel", 16000000, t)]
    write_lines(out, lines)
    model = report_json(trainprof_bin, out, "-o", str(out / "report.html"))
    (c,) = model["job"]["clock"]
    assert c == {"node": "algo-1", "state": "unsynchronised", "synchronised": False, "readings": 3,
                 "unsynchronised_readings": 3, "max_error_us": None, "est_error_us": None}, c
    page = (out / "report.html").read_text()
    clock = page.split("<h3>Clock</h3>")[1].split("</table>")[0]
    assert "unsynchronised" in clock and "16000000" not in clock and "16 000 000" not in clock, clock


def test_ten_thousand_gpu_names_are_capped_and_said(tmp_path, trainprof_bin):
    """10,000 distinct GPU names in a 1.1 MB system file (each its own tick): the report keeps
    the first 64 GPUs of the node (docs/report.md, "Caps"), says what it left out in --json and
    on the page, and its output stays small."""
    out = tmp_path / "out"
    write_lines(out, [sys_line("gpu", f"gpu{i}", "GPUUtilization", i % 100, 1795400000 + i * 0.1)
                      for i in range(10000)])
    proc = subprocess.run([str(trainprof_bin), "report", str(out), "--json", "-o", str(out / "report.html")],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    model = json.loads(proc.stdout)
    capped = {(c["what"], c["node"]): c for c in model["job"]["capped"]}
    assert capped[("gpus", "algo-1")] == {"what": "gpus", "node": "algo-1", "limit": 64, "left_out": 10000 - 64}
    usage = finding(model, "OverallSystemUsage")["evidence"]["nodes"]["algo-1"]
    assert sum(1 for k in usage if k.endswith("_util")) == 64
    assert len(proc.stdout) < 200_000, len(proc.stdout)
    page = (out / "report.html").read_text()
    assert "Part of the data was left out" in page and "GPUs of algo-1: the first 64 are kept; 9936 readings" in page
    assert len(page) < 2_000_000, len(page)


def test_terminal_escapes_in_a_rank_name_are_shown_not_obeyed(tmp_path, trainprof_bin):
    """A rank named with terminal escapes (a window title, hidden text) reaches the lines
    `report` prints (`finding: StepOutlier: …`): every control character is written as its
    escape, so the terminal shows them and obeys none."""
    out = tmp_path / "out"
    rank = "0-\x1b]0;owned\x07algo-1\x1b[8m"
    hour = out / "framework" / "pevents" / "2026112203"
    hour.mkdir(parents=True)
    ev = [{"name": "process_name", "ph": "M", "pid": 0, "args": {"start_time_since_epoch_in_micros": 1795400000000000}},
          {"name": "process_name", "ph": "M", "pid": 1, "args": {"name": "Step:ModeKeys.TRAIN"}}]
    for i in range(200):
        ev.append({"name": "Step:ModeKeys.TRAIN", "pid": 1, "ph": "X", "ts": i * 100000,
                   "dur": 500000 if i % 17 == 5 else 10000, "args": {"step_num": str(i)}})
    (hour / f"1795400020000000_{rank}_pythontimeline.json").write_text(json.dumps(ev))
    proc = subprocess.run([str(trainprof_bin), "report", str(out)], capture_output=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    err = proc.stderr.decode()
    assert "finding: StepOutlier:" in err, err
    assert "0-\\x1b]0;owned\\x07algo-1\\x1b[8m" in err, err
    assert not any(ord(c) < 32 and c != "\n" or 0x7f <= ord(c) < 0xa0 for c in err), repr(err)
