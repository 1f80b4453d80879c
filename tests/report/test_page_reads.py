"""A page a person reads: `trainprof report` and `trainprof trace` on the real H200
job of tests/fixtures/h200-resnet50 (48 s, 481 ticks, 850 steps) and on small planted
timelines (docs/report.md: "Short jobs", "The step chart", "Evidence tables", "Anchors", "The
trace").

Each test fails on the report before these changes: the 48 s job's system rules were all "not
evaluated", the step chart's axis ran to the 4 s first step, evidence had no units, triggers
linked nowhere, and `trace --steps 5-8` kept events of step 9 that start where step 8 ends."""

import gzip
import html
import json
import pathlib
import re
import subprocess
import tarfile

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
FIXTURE = ROOT / "tests" / "fixtures" / "h200-resnet50" / "job.tar.gz"

SYSTEM_RULES = ["CPUBottleneck", "IOBottleneck", "LowGPUUtilization", "GPUMemoryIncrease", "BatchSize"]


@pytest.fixture(scope="module")
def h200(tmp_path_factory):
    job = tmp_path_factory.mktemp("h200")
    with tarfile.open(FIXTURE) as t:
        t.extractall(job, filter="data")
    return job


def report(trainprof_bin, job, *args, page=None):
    argv = [str(trainprof_bin), "report", str(job), "--json", *args]
    if page is not None:
        argv += ["-o", str(page)]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout), proc.stderr


@pytest.fixture(scope="module")
def h200_report(h200, trainprof_bin, tmp_path_factory):
    page = tmp_path_factory.mktemp("page") / "page.html"
    model, stderr = report(trainprof_bin, h200, page=page)
    return model, stderr, page.read_text()


def finding(model, rule):
    return next(f for f in model["findings"] if f["rule"] == rule)


def page_data(page):
    text = page.split('id="report-data">', 1)[1].split("</script>", 1)[0]
    return json.loads(text)


def section(page, name):
    return page.split(f'<section id="{name}">', 1)[1].split("</section>", 1)[0]


def test_a_short_job_is_judged_preliminarily_and_says_so(h200, h200_report, trainprof_bin):
    """481 datapoints: every system rule is judged on what there is, labelled preliminary in
    --json, on the page and in the text lines; --patience 1000 gives SageMaker's not-evaluated."""
    model, stderr, page = h200_report
    for rule in SYSTEM_RULES:
        f = finding(model, rule)
        assert f["evaluated"], f
        assert f["preliminary"] == {"datapoints": 481, "patience": 1000, "unit": "datapoints"}, rule
        assert f["evidence"]["patience"] == 1000
    # One GPU: no pair to compare, so LoadBalancing stays not evaluated, not preliminary.
    assert finding(model, "LoadBalancing")["evaluated"] is False
    assert finding(model, "LoadBalancing")["preliminary"] is None
    assert finding(model, "Dataloader")["preliminary"] == {"datapoints": 1, "patience": 10, "unit": "seconds"}
    for rule in ("StepOutlier", "MaxInitializationTime", "OverallSystemUsage"):
        assert finding(model, rule)["preliminary"] is None
    # The GPU went idle during the windows' teardowns: LowGPUUtilization sees it.
    low = finding(model, "LowGPUUtilization")
    assert low["triggered"] and low["evidence"]["gpus"][0]["issue"] == "fluctuating"
    assert "finding: LowGPUUtilization:" in stderr
    assert "(preliminary: 481 of 1000 datapoints)" in stderr
    assert "findings judged on less than their patience of data: CPUBottleneck (preliminary: 481 of 1000 datapoints)" in stderr
    findings = section(page, "findings")
    assert findings.count('<span class="badge preliminary">preliminary: 481 of 1000 datapoints</span>') == 5
    assert findings.count('<span class="badge preliminary">preliminary: 1 of 10 seconds</span>') == 1
    assert "not evaluated: no data" not in findings

    sagemaker, stderr = report(trainprof_bin, h200, "--patience", "1000")
    for rule in SYSTEM_RULES + ["Dataloader"]:
        f = finding(sagemaker, rule)
        assert not f["evaluated"] and not f["triggered"] and f["preliminary"] is None, f
    assert "preliminary" not in stderr


def test_the_step_chart_fits_the_bulk_and_marks_the_rest(h200_report):
    """The 4 s first step and the windows' 0.6-1.2 s steps are marked above an axis that fits
    the 30-35 ms steps; step 0 is the warm-up."""
    model, _, page = h200_report
    train = model["steps"]["TRAIN"]
    chart = train["chart"]
    assert chart["y_min_ms"] == 0
    assert chart["y_max_ms"] == pytest.approx(1.5 * train["p99_ms"])
    assert 100 < chart["y_max_ms"] < 200 < train["max_ms"]
    assert sorted(o["step"] for o in chart["above"]) == [0, 202, 205, 208, 211, 214, 400]
    assert chart["above_count"] == 7
    assert all(o["ms"] > chart["y_max_ms"] for o in chart["above"])
    [warm] = chart["warmup"]
    assert (warm["steps"], warm["first_step"], warm["last_step"]) == (1, 0, 0)
    assert warm["ms"] == pytest.approx(train["max_ms"])
    # The page draws what the model carries: the axis, the marks, the warm-up band.
    data = page_data(page)
    [mode] = data["modes"]
    assert mode["y"] == [0.0, round(chart["y_max_ms"], 2)]
    assert sorted(o["step"] for o in mode["above"]) == [0, 202, 205, 208, 211, 214, 400]
    assert [b["kind"] for b in data["bands"]].count("warmup") == 1
    steps = section(page, "steps")
    assert "7 steps longer than the chart&#39;s axis" in steps or "7 steps longer than the chart's axis" in steps
    assert "<b>Warm-up</b> of 743-vm: its first step (step 0) took" in steps


def test_evidence_is_tables_with_units_and_no_json(h200_report):
    model, _, page = h200_report
    findings = section(page, "findings")
    text = html.unescape(re.sub(r"<[^>]+>", " ", findings))
    assert not re.search(r'[{\[]\s*"|"\s*:\s*[-\d{\["tfn]', text), text
    assert not re.search(r"\d\.\d{4,}", text), text
    assert "<tr><th>patience</th><td class=\"code\">1000 datapoints</td></tr>" in findings
    assert "<th>p95 <span class=\"unit\">(%)</span></th>" in findings
    assert "<tr><th>init_s</th><td class=\"code\">7.03 s</td></tr>" in findings
    # --json keeps the machine-readable evidence.
    assert finding(model, "OverallSystemUsage")["evidence"]["nodes"]["algo-1"]["cpu"]["p99"] > 40


def test_triggers_link_to_what_their_windows_show(h200_report):
    model, _, page = h200_report
    assert [(t["step"], t["window_start_step"], t["window_num_steps"]) for t in model["triggers"]] == [
        (202, 203, 2), (205, 206, 2), (208, 209, 2), (211, 212, 2)]
    triggers = section(page, "triggers")
    ids = set(re.findall(r' id="([^"]+)"', page))
    links = re.findall(r'<a href="#([^"]+)">(\w+)</a>', triggers)
    assert links, triggers
    # Every link lands on the page; the Python windows at least on their section.
    assert all(target in ids for target, _ in links), links
    assert ("python" in {f for _, f in links})
    assert "steps 203–204: " in triggers


def write_timeline(job, base_us, events, node="0-algo-1"):
    """A timeline file of `events` (phase, name, ts µs from base, dur, step)."""
    phases = sorted({e[0] for e in events})
    pid = {p: i + 1 for i, p in enumerate(phases)}
    doc = [{"name": "process_name", "ph": "M", "pid": 0, "args": {"start_time_since_epoch_in_micros": base_us}}]
    doc += [{"name": "process_name", "ph": "M", "pid": pid[p], "args": {"name": p}} for p in phases]
    doc += [{"name": n, "pid": pid[p], "ph": "X", "ts": ts, "dur": d, "args": {"step_num": str(s)}}
            for p, n, ts, d, s in events]
    end = base_us + max(ts + d for _, _, ts, d, _ in events)
    hour = job / "framework" / "pevents" / "2026112203"
    hour.mkdir(parents=True, exist_ok=True)
    (hour / f"{end}_{node}_pythontimeline.json").write_text(json.dumps(doc))


def test_trace_steps_clips_exactly_by_time(tmp_path, trainprof_bin):
    """Steps 0-12 of 100 ms back to back, each with a `Model.l1` op from its start; a kernel of
    step 8 runs 10 ms into step 9; ticks every 25 ms. `--steps 5-8` holds steps 5-8 and their
    ops, the kernel cut at step 8's end, no event of step 4 or 9, and only samples inside."""
    job = tmp_path / "job"
    base = 1_795_400_000_000_000
    events = []
    for k in range(13):
        start = 1_000_000 + k * 100_000
        events.append(("Step:ModeKeys.TRAIN", "Step:ModeKeys.TRAIN", start, 100_000, k))
        events.append(("Forward", "Model.l1", start, 30_000, k))
    events.append(("gpu_functions-dev:0", "volta_sgemm", 1_000_000 + 8 * 100_000 + 90_000, 20_000, 8))
    write_timeline(job, base, events)
    sys_dir = job / "system" / "incremental" / "2026112203"
    sys_dir.mkdir(parents=True)
    lines = []
    for i in range(60):
        t = round(base / 1e6 + 1.0 + i * 0.025, 3)
        lines.append(json.dumps({"Type": "cpu", "Name": "cpu0", "Dimension": "CPUUtilization", "Value": 10,
                                 "NodeId": "algo-1", "Timestamp": t}))
    (sys_dir / "1795400001.algo-1.json").write_text("\n".join(lines) + "\n")
    out = tmp_path / "t.json.gz"
    proc = subprocess.run([str(trainprof_bin), "trace", str(job), "--steps", "5-8", "-o", str(out)],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(gzip.decompress(out.read_bytes()))
    lo, hi = base + 1_500_000, base + 1_900_000
    slices = [e for e in doc if e["ph"] == "X"]
    steps = sorted(int(e["args"]["step_num"]) for e in slices if e["name"] == "Step:ModeKeys.TRAIN")
    assert steps == [5, 6, 7, 8]
    ops = sorted(int(e["args"]["step_num"]) for e in slices if e["name"] == "Model.l1")
    assert ops == [5, 6, 7, 8], "Model.l1 of step 9 starts where step 8 ends: not in the span"
    [kernel] = [e for e in slices if e["name"] == "volta_sgemm"]
    assert (kernel["ts"], kernel["dur"]) == (base + 1_890_000, 10_000)
    assert all(lo <= e["ts"] and e["ts"] + e["dur"] <= hi for e in slices), slices
    samples = [e["ts"] for e in doc if e["ph"] == "C"]
    assert samples and all(lo <= t <= hi for t in samples)
    # 500-900 ms after the first tick, every 25 ms, both edges included.
    assert len(samples) == 17


def test_evidence_is_shaded_where_it_lies_and_the_windows_are_marked(h200_report):
    """The 48 s job is one judged window of LowGPUUtilization (`fluctuating`): its shading is
    the ticks where gpu0 was below 10 %, not the whole job (which marked nothing); the profiled
    windows are marked along the time axis; "1 native window" is singular."""
    model, _, page = h200_report
    job = model["job"]
    span = job["end_s"] - job["start_s"]
    low = finding(model, "LowGPUUtilization")
    assert low["triggered"] and low["evidence"]["gpus"][0]["issue"] == "fluctuating"
    covered = sum(b - a for a, b in low["ranges"])
    assert len(low["ranges"]) > 1 and 0 < covered < 0.6 * span, low["ranges"]
    data = page_data(page)
    shaded = [b for b in data["bands"] if b["kind"] == "finding"]
    assert shaded and sum(b["b"] - b["a"] for b in shaded) < 0.6 * span
    assert not any(b["a"] <= 0.5 and b["b"] >= span - 0.5 for b in shaded), shaded
    # On the GPU charts only, not on every chart.
    assert all(b["on"] == ["gpu util", "gpu mem"] for b in shaded), shaded
    # Every profiled window with times is marked: the detailed windows, the Python windows,
    # the native window.
    t0 = data["t0"]
    marks = [(b["a"], b["b"]) for b in data["bands"] if b["kind"] == "window"]
    want = [(w["start_s"], w["end_s"]) for w in model["detailed"]["windows"]]
    want += [(w["start_s"], w["end_s"]) for w in model["python"] if w.get("start_s") is not None]
    want += [(w["start_s"], w["end_s"]) for w in model["native"]]
    assert len(marks) == len(want) > 0
    (native,) = model["native"]
    assert any(abs(a - (native["start_s"] - t0)) < 0.01 and abs(b - (native["end_s"] - t0)) < 0.01 for a, b in marks)
    assert "profiled windows (marked along" in section(page, "system")
    assert ", 1 native window</td>" in page and "1 native windows" not in page
