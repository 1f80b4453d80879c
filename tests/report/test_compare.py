"""`trainprof compare A B` (docs/report.md, "compare") on jobs with known answers: real
`trainprof run`s around tests/report/scripts/phase_trainer.py (phases in every step, one of
them planted slower, a second rank, a Python-profiling window), and, for the ten pairs of
identical runs and the hostile names, timelines written in the documented format with known
step-time distributions (bench/synth_job.py's writer).

What each test reproduces: a regression in one phase is called "slower" with an interval that
holds the planted figure and is found in that phase first; the same code is "no difference";
identical runs never fail the 5 % gate; a different rank count or profiling config is listed
as not comparable; the exit statuses 0 / 1 / 2; hostile names stay text on the page."""

import json
import os
import pathlib
import random
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "tests" / "report" / "scripts" / "phase_trainer.py"
sys.path.insert(0, str(ROOT / "bench"))

from synth_job import Timeline  # noqa: E402

# Compute is most of the step and long (100 ms), so the scheduling delays of a busy machine
# (a few ms at worst) stay small beside the planted 10 ms.
STEPS = 80
PHASES = [["DataLoaderIter", 2], ["Compute", 100], ["AllReduce", 2]]
SHORT = [["DataLoaderIter", 2], ["Compute", 20], ["AllReduce", 2]]


def run_job(work, trainprof_bin, hook_lib, package_dir, params, config=None):
    """`trainprof run` around phase_trainer.py; returns (out, manifests)."""
    work.mkdir(parents=True, exist_ok=True)
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
               TRAINPROF_TEST_MANIFEST=str(work / "manifest.json"), TRAINPROF_TEST_PARAMS=json.dumps(params),
               TRAINPROF_NVML_LIB=str(work / "no-libnvidia-ml.so.1"))
    proc = subprocess.run(
        [str(trainprof_bin), "run", "--no-report", "--config", str(cfg), "--interval-ms", "100", "--",
         sys.executable, str(SCRIPT)],
        env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    ranks = params.get("ranks")
    names = [work / "manifest.json"] if not ranks else [work / f"manifest.json.{i}" for i in range(ranks)]
    return out, [json.loads(p.read_text()) for p in names]


def compare(trainprof_bin, a, b, *args):
    """`trainprof compare A B --json ARGS`: (status, json or None, stderr)."""
    proc = subprocess.run([str(trainprof_bin), "compare", str(a), str(b), "--json", *args],
                          capture_output=True, text=True, timeout=120)
    doc = json.loads(proc.stdout) if proc.stdout.strip() else None
    return proc.returncode, doc, proc.stderr


def median(v):
    s = sorted(v)
    n = len(s)
    return s[n // 2] if n % 2 else (s[n // 2 - 1] + s[n // 2]) / 2


@pytest.fixture(scope="module")
def real_runs(tmp_path_factory, trainprof_bin, hook_lib, package_dir):
    """A; B with Compute planted 10 % slower; C the same as A; D with two ranks; E with a
    Python-profiling window (D and E with short steps). Run one after another (~35 s in all on
    a quiet machine)."""
    base = tmp_path_factory.mktemp("compare")
    p = {"steps": STEPS, "phases": PHASES}
    runs = {
        "a": run_job(base / "a", trainprof_bin, hook_lib, package_dir, p),
        "b": run_job(base / "b", trainprof_bin, hook_lib, package_dir, {**p, "slow": {"Compute": 1.1}}),
        "c": run_job(base / "c", trainprof_bin, hook_lib, package_dir, p),
        "d": run_job(base / "d", trainprof_bin, hook_lib, package_dir, {"steps": 60, "phases": SHORT, "ranks": 2}),
        "e": run_job(base / "e", trainprof_bin, hook_lib, package_dir, {"steps": 60, "phases": SHORT},
                     config={"PythonProfilingConfig": {"StartStep": 30, "NumSteps": 2}}),
    }
    return base, runs


def test_a_planted_phase_is_slower_and_tops_the_movers(real_runs, trainprof_bin):
    base, runs = real_runs
    (a, [ma]), (b, [mb]) = runs["a"], runs["b"]
    page = base / "ab.html"
    status, doc, stderr = compare(trainprof_bin, a, b, "--fail-if-slower", "5", "-o", str(page))
    s = doc["steps"]["TRAIN"]
    assert s["verdict"] == "slower", s
    assert s["text"].startswith("B is ") and " % slower (95 % CI " in s["text"]
    # The planted figure: Compute 10 % slower is 10 ms more on A's ~104 ms step. What it came
    # to in these two runs is the ratio of the kept steps' medians as the trainer itself timed
    # them (sleeps overshoot differently from run to run on a busy machine, by about as much
    # as the interval is wide when the machine is quiet): the interval holds it, and it is the
    # planted 10 ms to within 3 ms.
    step_a = median([x["ms"] for x in ma["steps"][10:]])
    step_b = median([x["ms"] for x in mb["steps"][10:]])
    planted = 100 * (step_b / step_a - 1)
    lo, hi = s["ci_pct"]
    assert lo <= planted <= hi, (planted, s)
    assert abs((step_b - step_a) - 0.1 * PHASES[1][1]) < 3.0, (step_a, step_b)
    assert 6 < s["change_pct"] < 13
    # Warm-up left out of both sides, nothing else (no window).
    assert s["a"]["warmup_left_out"] == 10 and s["a"]["window_left_out"] == 0
    assert s["a"]["kept"] == STEPS - 10 and s["b"]["kept"] == STEPS - 10
    top = doc["movers"][0]
    assert (top["kind"], top["name"]) == ("phase", "Compute"), doc["movers"]
    # Medians per kept step: a stalled step on a busy machine does not move them.
    assert top["stat"] == "median"
    assert 7 < top["diff_ms"] < 13 and 0.7 < top["explains"] < 1.3, top
    others = {m["name"]: m for m in doc["movers"][1:]}
    # The unchanged phases move by the machine's noise only, well below the planted one.
    assert all(abs(others[p]["diff_ms"]) < top["diff_ms"] / 2 for p in ("AllReduce", "DataLoaderIter")), others
    assert doc["comparable"]["ok"], doc["comparable"]
    metrics = {m["metric"] for m in doc["system"]}
    assert {"CPU total", "memory", "trainer CPU"} <= metrics, metrics
    if pathlib.Path("/proc/pressure/cpu").exists():
        assert {"CPU pressure", "memory pressure", "I/O pressure"} <= metrics, metrics
    # The gate: slower by more than 5 % with the interval above 5 % (as on a quiet machine;
    # a very busy one can widen the interval below 5 %, and then the gate rightly passes):
    # 1, and one line why.
    gate = [line for line in stderr.splitlines() if line.startswith("trainprof: gate: ")]
    assert len(gate) == 1, stderr
    if lo > 5:
        assert status == 1 and "slower by more than 5.0 %" in gate[0], stderr
        assert doc["gate"]["failed"] and doc["gate"]["mode"] == "TRAIN"
    else:
        assert status == 0 and "interval reaches down to" in gate[0], stderr
    html = page.read_text()
    assert s["text"] in html and "Compute" in html and 'id="compare-data"' in html
    # A gate above the change passes.
    status, doc, stderr = compare(trainprof_bin, a, b, "--fail-if-slower", "20")
    assert status == 0 and not doc["gate"]["failed"], stderr


def test_the_same_code_is_no_difference(real_runs, trainprof_bin):
    _, runs = real_runs
    (a, [ma]), (c, [mc]) = runs["a"], runs["c"]
    status, doc, stderr = compare(trainprof_bin, a, c, "--fail-if-slower", "5")
    s = doc["steps"]["TRAIN"]
    assert doc["comparable"]["ok"], doc["comparable"]
    # What the trainer itself timed: the interval holds it.
    truth = 100 * (median([x["ms"] for x in mc["steps"][10:]]) / median([x["ms"] for x in ma["steps"][10:]]) - 1)
    lo, hi = s["ci_pct"]
    assert lo - 0.05 <= truth <= hi + 0.05, (truth, s)
    # The 5 % gate passes unless the machine made the second run that much slower (a load of
    # 13 on 2 cores made it 5.3 % once, and the interval then reached below 5 %).
    if truth < 5:
        assert status == 0 and not doc["gate"]["failed"], (truth, doc["gate"], stderr)
    # The same code: no difference, unless the machine itself made one run slower by more
    # than the threshold's half (another job's load on a shared machine moves the sleeps'
    # overshoot; the trainer's own timing then shows it too).
    if abs(truth) < 0.5:
        assert s["verdict"] == "same", (truth, s)
        assert "within 5.0 %" in doc["gate"]["why"], doc["gate"]
        assert s["text"].startswith("no difference beyond noise (±"), s["text"]
        assert all(abs(m["diff_ms"]) < 2.0 and m["explains"] is None for m in doc["movers"]), doc["movers"]


def test_other_rank_counts_and_configs_are_listed_as_not_comparable(real_runs, trainprof_bin):
    _, runs = real_runs
    status, doc, _ = compare(trainprof_bin, runs["a"][0], runs["d"][0])
    items = {i["what"]: i for i in doc["comparable"]["items"]}
    assert status == 0
    assert not doc["comparable"]["ok"]
    assert items["ranks"]["status"] == "differs" and (items["ranks"]["a"], items["ranks"]["b"]) == ("1", "2")
    assert items["profiling config (what was profiled)"]["status"] == "same"
    # The comparability list comes first on the page and in the JSON.
    assert list(doc).index("comparable") < list(doc).index("steps")
    status, doc, stderr = compare(trainprof_bin, runs["a"][0], runs["e"][0])
    items = {i["what"]: i for i in doc["comparable"]["items"]}
    assert not doc["comparable"]["ok"]
    cfg = items["profiling config (what was profiled)"]
    assert cfg["status"] == "differs" and "python (cprofile)" in cfg["b"], cfg
    assert items["ranks"]["status"] == "same"
    assert "not comparable: profiling config" in stderr
    # B's Python windows' functions are among the movers (A has none: 0 ms).
    py = [m for m in doc["movers"] if m["kind"] == "python"]
    assert py and all(m["a_ms"] == 0 and m["b_ms"] > 0 for m in py), doc["movers"]
    assert any("sleep" in m["name"] for m in py), py
    # The window's steps (30, 31) and the one after are left out of B.
    s = doc["steps"]["TRAIN"]
    assert s["b"]["window_left_out"] >= 3, s["b"]
    assert s["b"]["kept"] + s["b"]["window_left_out"] + s["b"]["warmup_left_out"] == 60


def synth(path, seed, steps=300, ms=40.0, sigma=0.05, phase="Compute", node="0-algo-1"):
    """One rank's timeline: `steps` train steps with log-normal times around `ms` (σ of the
    log: `sigma`), each holding one `phase` event of 80 % of it."""
    rng = random.Random(seed)
    base = 1795312800_000_000
    tl = Timeline(str(path), node, 4000, base)
    t = base + 1_000_000
    for step in range(steps):
        dur = int(ms * 1000 * rng.lognormvariate(0, sigma))
        tl.event(phase, "model.compute", t + 100, int(dur * 0.8), step)
        tl.event("Step:ModeKeys.TRAIN", "Step:ModeKeys.TRAIN", t, dur, step)
        t += dur + 100
    tl.seal()
    return path


def test_ten_identical_pairs_never_fail_the_gate(tmp_path, trainprof_bin):
    """Ten pairs of runs from the same distribution (40 ms, 5 % spread, 300 steps each): the
    5 % gate passes every time, and none is called slower."""
    verdicts = []
    for k in range(10):
        a = synth(tmp_path / f"a{k}", seed=2 * k)
        b = synth(tmp_path / f"b{k}", seed=2 * k + 1)
        status, doc, stderr = compare(trainprof_bin, a, b, "--fail-if-slower", "5")
        assert status == 0, stderr
        s = doc["steps"]["TRAIN"]
        assert s["ci_pct"][1] < 5, s
        verdicts.append(s["verdict"])
    assert "slower" not in verdicts, verdicts


def test_exit_statuses(tmp_path, trainprof_bin):
    a = synth(tmp_path / "a", seed=1)
    b = synth(tmp_path / "b", seed=2, ms=48.0)  # 20 % slower
    assert compare(trainprof_bin, a, b)[0] == 0
    status, doc, _ = compare(trainprof_bin, a, b, "--mode", "train", "--warmup", "50", "--noise", "25")
    assert status == 0 and list(doc["steps"]) == ["TRAIN"] and doc["mode"] == "TRAIN"
    assert doc["steps"]["TRAIN"]["a"]["warmup_left_out"] == 50 and doc["warmup"] == 50
    assert doc["steps"]["TRAIN"]["verdict"] == "same"  # 20 % is under a 25 % threshold
    status, doc, stderr = compare(trainprof_bin, a, b, "--fail-if-slower", "5")
    assert status == 1 and doc["steps"]["TRAIN"]["verdict"] == "slower"
    assert stderr.count("trainprof: gate: ") == 1
    # Faster is never a failure.
    assert compare(trainprof_bin, b, a, "--fail-if-slower", "5")[0] == 0
    # Unusable input: 2, one line why.
    (tmp_path / "empty").mkdir()
    for args, why in [
        ((a, tmp_path / "missing"), "not a folder"),
        ((a, tmp_path / "empty"), "holds no profiler data"),
        ((a, b, "--mode", "eval", "--fail-if-slower", "5"), "no EVAL steps"),
        ((a, b, "--noise=-1"), "percentage"),
        ((a, b, "--fail-if-slower", "nan"), "percentage"),
        ((a, "s3://"), "s3"),
    ]:
        status, _, stderr = compare(trainprof_bin, *args)
        assert status == 2, (args, stderr)
        assert why in stderr, (why, stderr)
    # A page is never written over a file: 2.
    (tmp_path / "p.html").write_text("mine")
    status, _, stderr = compare(trainprof_bin, a, b, "-o", str(tmp_path / "p.html"))
    assert status == 2 and "exists: not replaced" in stderr
    assert (tmp_path / "p.html").read_text() == "mine"
    # A bad flag: clap's 2.
    assert subprocess.run([str(trainprof_bin), "compare", str(a)], capture_output=True).returncode == 2


HOSTILE = '<img src=x onerror="document.body.dataset.xss=1">&\u2028</script><!--'


def test_hostile_names_stay_text(tmp_path, trainprof_bin):
    """A's folder and B's phase and rank carry markup: on the page they are escaped text."""
    a = synth(tmp_path / ("a" + HOSTILE.replace("/", "_")), seed=1)
    b = synth(tmp_path / "b", seed=2, phase=HOSTILE, node="0-" + "x<b>y")
    page = tmp_path / "page.html"
    status, doc, stderr = compare(trainprof_bin, a, b, "-o", str(page))
    assert status == 0, stderr
    html = page.read_text()
    assert "<img" not in html and "<b>y" not in html
    assert html.count("<script") == 3  # the data, uPlot, the page's script
    assert html.count("</script>") == 3
    assert "&lt;img src=x onerror=&quot;document.body.dataset.xss=1&quot;&gt;" in html
    assert any(m["name"] == HOSTILE for m in doc["movers"])
    # The embedded data has no markup either.
    data = html.split('id="compare-data">', 1)[1].split("</script>", 1)[0]
    assert "<" not in data and ">" not in data and "&" not in data


def test_s3_prefixes_are_read_like_local_paths(tmp_path, trainprof_bin, s3):
    """Both jobs from S3 (one temporary folder for both, removed at the end): the same
    comparison as from the LocalPaths."""
    a = synth(tmp_path / "a", seed=1)
    b = synth(tmp_path / "b", seed=2, ms=44.0)
    _, local, _ = compare(trainprof_bin, a, b)
    for name, root in (("a", a), ("b", b)):
        for p in root.rglob("*.json"):
            s3.client.upload_file(str(p), s3.bucket, f"jobs/{name}/" + str(p.relative_to(root)))
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    from s3_support import agent_env
    env.update(agent_env(s3.endpoint))
    temp = tmp_path / "tmp"
    temp.mkdir()
    env["TMPDIR"] = str(temp)
    proc = subprocess.run([str(trainprof_bin), "compare", f"s3://{s3.bucket}/jobs/a", f"s3://{s3.bucket}/jobs/b",
                           "--json", "--s3-endpoint", s3.endpoint, "--fail-if-slower", "5"],
                          capture_output=True, text=True, timeout=120, env=env, cwd=tmp_path)
    assert proc.returncode == 1, proc.stderr
    remote = json.loads(proc.stdout)
    assert remote["a"]["source"] == f"s3://{s3.bucket}/jobs/a"
    assert remote["steps"] == local["steps"] and remote["movers"] == local["movers"]
    assert list(temp.iterdir()) == []
    # A prefix with nothing under it: unusable.
    proc = subprocess.run([str(trainprof_bin), "compare", f"s3://{s3.bucket}/jobs/a", f"s3://{s3.bucket}/none",
                           "--s3-endpoint", s3.endpoint], capture_output=True, text=True, timeout=120, env=env)
    assert proc.returncode == 2 and "no profiler files" in proc.stderr, proc.stderr


def test_the_real_h200_job_against_itself(tmp_path, trainprof_bin):
    """The real H200 job (tests/fixtures/h200-resnet50: every window): compared with itself,
    no difference; its detailed, Python and native windows' steps are left out; the detailed
    windows' classes and kernels and the Python functions are among the movers, unmoved."""
    import tarfile

    job = tmp_path / "h200"
    with tarfile.open(ROOT / "tests" / "fixtures" / "h200-resnet50" / "job.tar.gz") as t:
        t.extractall(job, filter="data")
    status, doc, stderr = compare(trainprof_bin, job, job, "--fail-if-slower", "5")
    assert status == 0, stderr
    s = doc["steps"]["TRAIN"]
    assert s["verdict"] == "same" and s["ratio"] == 1.0
    assert s["a"]["window_left_out"] > 0 and s["a"]["warmup_left_out"] == 10
    kinds = {m["kind"] for m in doc["movers"]}
    assert {"detailed", "python"} <= kinds, kinds
    assert any(m["name"].startswith("class: ") for m in doc["movers"])
    assert all(m["diff_ms"] == 0 and m["explains"] is None for m in doc["movers"])
    assert doc["comparable"]["ok"] and doc["findings"] == []
