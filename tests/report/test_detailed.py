"""`trainprof report` explains the detailed windows (docs/report.md, "Detailed windows"):
a synthetic window with planted answers, written as timeline files, and the real H200 job
of tests/fixtures/h200-resnet50 (ResNet-50, bf16: BatchNorm kernels are its largest class)."""

import json
import pathlib
import subprocess
import tarfile

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
FIXTURE = ROOT / "tests" / "fixtures" / "h200-resnet50" / "job.tar.gz"
T0 = 1_795_400_000_000_000  # the timeline's base time, epoch µs
RANK = "0-algo-1"


def report(trainprof_bin, path, page=None):
    args = [str(trainprof_bin), "report", str(path), "--json"]
    if page is not None:
        args += ["-o", str(page)]
    proc = subprocess.run(args, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def write_timeline(root, events):
    """One timeline file of ``events`` (phase, name, start µs, end µs, step, args), times from T0."""
    phases = sorted({e[0] for e in events})
    out = [{"name": "process_name", "ph": "M", "pid": 0, "args": {"start_time_since_epoch_in_micros": T0}}]
    out += [{"name": "process_name", "ph": "M", "pid": i + 1, "args": {"name": p}} for i, p in enumerate(phases)]
    last = 0
    for phase, name, a, b, step, args in events:
        out.append({"name": name, "pid": phases.index(phase) + 1, "ph": "X", "ts": a, "dur": b - a,
                    "args": {"pid": 7, "step_num": str(step), **args}})
        last = max(last, b)
    d = root / "framework" / "pevents" / "2026112203"
    d.mkdir(parents=True)
    (d / f"{T0 + last + 1}_{RANK}_pythontimeline.json").write_text(json.dumps(out))


GPU = "gpu_functions-dev:0"
CPU = "cpu_functions"
GETNEXT = "_MultiProcessingDataLoaderIter.DataLoaderIter::GetNext"


def planted_events():
    """Steps 10 and 11 (200 ms) of a detailed window. Planted: 77 ms of kernels (GEMM 30,
    BatchNorm 10, elementwise 5 + 5, memcpy 2, NCCL 20, reduction 5); the GPU idle 123 ms:
    waiting for input 30 (a DataLoader wait numbered step 12 but inside the window by time,
    10 ms of it overlapping a CPU op: input wins), synchronising 10, a kernel queued 4, the
    host launching 33 + 10, other 36."""
    k = lambda name, a, b, step, **args: (GPU, name, a, b, step, {"device": 0, **args})  # noqa: E731
    op = lambda name, a, b, step, tid=1: (CPU, name, a, b, step, {"tid": tid})  # noqa: E731
    return [
        ("Step:ModeKeys.TRAIN", "Step:ModeKeys.TRAIN", 0, 100_000, 10, {}),
        ("Step:ModeKeys.TRAIN", "Step:ModeKeys.TRAIN", 100_000, 200_000, 11, {}),
        ("Step:ModeKeys.TRAIN", "Step:ModeKeys.TRAIN", 200_000, 300_000, 12, {}),
        k("sm90_xmma_fprop_implicit_gemm_bf16", 10_000, 40_000, 10),
        k("void at::native::batch_norm_collect_statistics_kernel<float>", 40_000, 50_000, 10),
        k("void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>>", 50_000, 55_000, 10),
        k("Memcpy HtoD (Pinned -> Device)", 55_000, 57_000, 10),
        k("ncclDevKernel_AllReduce_Sum_f32_RING_LL", 150_000, 170_000, 11),
        k("void at::native::reduce_kernel<512, 1>", 170_000, 175_000, 11),
        k("triton_poi_fused_add_0", 190_000, 195_000, 11, cpu_thread_start_time=T0 + 186_000, stream=7,
          correlation=99),
        k("Optimizer.step#SGD.step", 10_000, 57_000, 10, annotation=1),
        op("aten::conv2d", 57_000, 90_000, 10),
        op("cudaLaunchKernel", 60_000, 61_000, 10),
        op("aten::to", 110_000, 130_000, 11),
        op("Optimizer.step#SGD.step", 150_000, 151_000, 11, tid=2),
        op("cudaDeviceSynchronize", 175_000, 185_000, 11),
        op("cudaLaunchKernel", 186_000, 187_000, 11),
        ("DataLoaderIter", GETNEXT, 90_000, 120_000, 12, {}),
        ("DataLoaderIter", GETNEXT, 250_000, 260_000, 11, {}),  # after the window: not its
    ]


def close(got, want, rel=0.01):
    return got == pytest.approx(want, rel=rel, abs=1e-9)


def by_name(shares):
    return {s["name"]: s for s in shares}


def test_a_planted_window_gives_the_planted_categories_and_classes(trainprof_bin, tmp_path):
    write_timeline(tmp_path, planted_events())
    m = report(trainprof_bin, tmp_path, page=tmp_path / "report.html")
    d = m["detailed"]
    assert len(d["windows"]) == 1
    w = d["windows"][0]
    assert (w["rank"], w["device"], w["first_step"], w["last_step"], w["steps"]) == (RANK, 0, 10, 11, 2)
    assert close(w["wall_ms"], 200) and close(w["busy_ms"], 77) and close(w["compute_busy_ms"], 75)
    assert close(w["busy_pct"], 38.5) and close(w["idle_ms"], 123)
    idle = by_name(w["idle"])
    assert list(idle) == ["input", "sync", "queued", "launching", "other"]
    for cat, ms in {"input": 30, "sync": 10, "queued": 4, "launching": 43, "other": 36}.items():
        assert close(idle[cat]["ms"], ms), (cat, idle[cat])
        assert close(idle[cat]["pct"], ms / 2), (cat, idle[cat])
    classes = by_name(w["classes"])
    for cls, ms in {"gemm/convolution": 30, "normalisation": 10, "elementwise": 10, "memcpy/memset": 2,
                    "communication": 20, "reduction": 5, "other": 0}.items():
        assert close(classes[cls]["ms"], ms), (cls, classes[cls])
    assert classes["elementwise"]["count"] == 2
    assert (w["kernels"], w["annotations"]) == (7, 1)
    assert w["launch_delay"]["p50_us"] == 4000 and w["launch_delay"]["kernels"] == 1
    assert [(o["name"], o["count"], o["self_ms"]) for o in w["top_ops"][:2]] == [
        ("aten::conv2d", 1, 32.0), ("aten::to", 1, 20.0)]
    assert w["top_kernels"][0]["name"] == "sm90_xmma_fprop_implicit_gemm_bf16"
    assert w["top_kernels"][0]["class"] == "gemm/convolution"
    assert "the GPU busy 77.0 ms (38 %" in w["sentence"]
    assert m["detailed"]["total"]["windows"] == 1
    # The page: the section, its numbers, the bars of cpu_functions / gpu_functions gone.
    page = (tmp_path / "report.html").read_text()
    assert '<section id="detailed">' in page and "43.0 ms the host still launching" in page
    data = page.split('<script type="application/json" id="report-data">')[1].split("</script>")[0]
    phases = [p["name"] for p in json.loads(data)["phases"]]
    assert "DataLoaderIter" in phases and CPU not in phases and GPU not in phases


@pytest.fixture(scope="module")
def h200(tmp_path_factory):
    d = tmp_path_factory.mktemp("h200")
    with tarfile.open(FIXTURE) as t:
        t.extractall(d, filter="data")
    return d


def test_the_h200_job_names_batchnorm_the_largest_class_and_gives_the_busy_idle_split(trainprof_bin, h200, tmp_path):
    m = report(trainprof_bin, h200, page=tmp_path / "report.html")
    d = m["detailed"]
    t = d["total"]
    # Five windows of two steps (200-201, and four anomaly-opened ones), GPU 0.
    assert [(w["first_step"], w["last_step"], w["device"]) for w in d["windows"]] == [
        (200, 201, 0), (203, 204, 0), (206, 207, 0), (209, 210, 0), (212, 213, 0)]
    # 10,060 device events, 293 ms: 10,050 kernels (290 ms) and 10 ranges of the
    # record_function `Optimizer.step#SGD.step` (3.1 ms), which are not kernels.
    assert (t["kernels"], t["annotations"]) == (10_050, 10)
    assert close(t["gpu_ms"] + t["annotations_ms"], 293.0)
    classes = sorted(t["classes"], key=lambda c: -c["ms"])
    assert classes[0]["name"] == "normalisation"
    assert close(classes[0]["ms"], 127.1) and classes[0]["count"] == 2650
    assert 43 <= classes[0]["pct"] < 44  # of the kernels' 290 ms (43 % of all 293 ms)
    assert [c["name"] for c in classes[1:3]] == ["gemm/convolution", "elementwise"]
    assert all("batch_norm" in k["name"] for k in t["top_kernels"][:4])
    # The busy/idle split of the windows' 800 ms: busy 289 ms (36 %), idle mostly the host
    # launching (CPU ops running) and time with no op recorded (the profiler starting in
    # each window's first step, the data between steps); no DataLoader window overlapped.
    assert close(t["wall_ms"], 799.9) and close(t["busy_ms"], 288.8) and close(t["busy_pct"], 36.1)
    idle = by_name(t["idle"])
    assert close(sum(c["ms"] for c in t["idle"]), t["idle_ms"]) and close(t["idle_ms"] + t["busy_ms"], t["wall_ms"])
    assert idle["input"]["ms"] == 0 and idle["queued"]["ms"] == 0
    assert close(idle["launching"]["ms"], 309.5) and close(idle["other"]["ms"], 201.2)
    assert t["launch_delay"] is None  # written before the adapter recorded launches
    assert t["top_ops"][0]["name"] == "cudaLaunchKernel" and t["top_ops"][0]["count"] == 7000
    assert "normalisation kernels (127 ms, 44 % of GPU time)" in t["sentence"]
    page = (tmp_path / "report.html").read_text()
    assert "Detailed windows" in page and "normalisation" in page and "batch_norm_collect_statistics" in page


ARGS_FIXTURE = ROOT / "tests" / "fixtures" / "h200-resnet50-args" / "job.tar.gz"


def test_a_real_h200_window_with_launch_args_gives_the_launch_delay_and_queued_time(trainprof_bin, tmp_path):
    """The adapter's kernel args as a real H200 wrote them (tests/fixtures/h200-resnet50-args):
    every kernel finds its launch, so the launch delay and the `queued` idle category are real
    numbers, not absent."""
    with tarfile.open(ARGS_FIXTURE) as t:
        t.extractall(tmp_path / "job", filter="data")
    events = []
    for f in (tmp_path / "job" / "framework" / "pevents").glob("*/*.json"):
        events += json.loads(f.read_text())
    gpu_pids = {e["pid"] for e in events if e.get("ph") == "M" and str(e["args"].get("name", "")).startswith("gpu_functions")}
    kernels = [e for e in events if e.get("ph") == "X" and e["pid"] in gpu_pids and "annotation" not in e["args"]]
    assert len(kernels) == 2010
    assert all({"stream", "correlation", "cpu_thread_start_time", "device"} <= e["args"].keys() for e in kernels)
    total = report(trainprof_bin, tmp_path / "job")["detailed"]["total"]
    assert total["windows"] == 1 and total["kernels"] == 2010
    delay = total["launch_delay"]
    assert delay["kernels"] == 2010
    assert 1 <= delay["p50_us"] <= 100, delay
    idle = {c["name"]: c["ms"] for c in total["idle"]}
    assert idle["queued"] > 0
    classes = sorted(total["classes"], key=lambda c: -c["ms"])
    assert classes[0]["name"] == "normalisation" and 40 <= classes[0]["pct"] <= 48
    assert "A kernel started a median" in total["sentence"]
