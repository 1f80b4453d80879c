"""`trainprof report` and `trainprof trace` on hangs and crashes (docs/report.md, "Hangs and
crashes"): synthetic LocalPaths of two ranks, their timelines written as the hook writes them and
dump folders as docs/formats.md ("Hang and crash dumps") describes them. Rank 1 stops stepping
after step 29 (no dump: it is not inside a step) while rank 0's step 30 stalls waiting for it:
the report names rank 1 and step 30. A crash shows its stack; hostile names and stacks stay
text; the trace has the stall as a slice."""

import gzip
import html
import json
import os
import pathlib
import re
import subprocess
import sys
import time

T0 = 1_795_400_000_000_000  # the timelines' base time, epoch µs
STEP_US = 10_000
STALL_AT = T0 + 30 * STEP_US + 1_000  # rank 0 begins step 30 here…
DETECTED = STALL_AT + 5_000_000  # …and its watchdog sees the stall 5 s later


def run(trainprof_bin, *args):
    proc = subprocess.run([str(trainprof_bin), *map(str, args)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    return proc


def report(trainprof_bin, path, page):
    return json.loads(run(trainprof_bin, "report", path, "--json", "-o", page).stdout)


def write_timeline(root, rank, steps):
    """Rank ``rank``'s timeline: steps ``0..steps-1`` of 10 ms each, back to back from T0."""
    out = [
        {"name": "process_name", "ph": "M", "pid": 0, "args": {"start_time_since_epoch_in_micros": T0}},
        {"name": "process_name", "ph": "M", "pid": 1, "args": {"name": "Step:ModeKeys.TRAIN"}},
    ]
    for i in range(steps):
        out.append({"name": "Step:ModeKeys.TRAIN", "pid": 1, "ph": "X", "ts": i * STEP_US, "dur": STEP_US - 100,
                    "args": {"step_num": str(i)}})
    d = root / "framework" / "pevents" / "2026112203"
    d.mkdir(parents=True, exist_ok=True)
    (d / f"{T0 + steps * STEP_US}_{rank}_pythontimeline.json").write_text(json.dumps(out))


def write_dump(root, node, step, detected_us, files):
    d = root / "framework" / "hangs" / node / f"{step}-{detected_us}"
    d.mkdir(parents=True)
    # stall.json last: its presence means the folder is complete.
    for name in sorted(files, key=lambda n: n == "stall.json"):
        body = files[name]
        (d / name).write_text(body if isinstance(body, str) else json.dumps(body))
    return d


def stall_json(node, step, **over):
    v = {"version": 1, "kind": "stall", "node": node, "pid": 4242, "mode": "train", "step": step,
         "step_started_us": STALL_AT, "detected_us": DETECTED, "threshold_s": 5.0, "median_step_s": 0.0099,
         "last_completed_step": step - 1, "signal": None,
         "ring": [{"t_us": STALL_AT - STEP_US, "what": "step_end", "name": "Step:ModeKeys.TRAIN", "step": step - 1},
                  {"t_us": STALL_AT, "what": "step_start", "name": "Step:ModeKeys.TRAIN", "step": step}],
         "open_windows": [], "hook": {"watchdog": "on"}}
    v.update(over)
    return v


PY_STACKS = """Thread 0x00007f0000000002 (most recent call first):
  File "/usr/lib/python3/site-packages/trainprof/_watchdog.py", line 88 in _run

Current thread 0x00007f0000000002 (most recent call first):
  File "/usr/lib/python3/site-packages/trainprof/_watchdog.py", line 91 in _dump

Thread 0x00007f0000000001 (most recent call first):
  File "/job/train.py", line 41 in wait_for_peer
  File "/job/train.py", line 60 in train_step
  File "/job/train.py", line 77 in <module>
"""

NATIVE = """thread 100 python3
  #0 0x00007f00000a0001 read
  #1 0x00007f00000a0002 _Py_read

thread 101 trainprof-watch
  #0 0x00007f00000a0003 clock_nanosleep
"""


def two_ranks(root):
    write_timeline(root, "0-algo-1", 30)
    write_timeline(root, "1-algo-1", 30)
    write_dump(root, "0-algo-1", 30, DETECTED, {
        "python_stacks.txt": PY_STACKS, "native_stacks.txt": NATIVE, "stall.json": stall_json("0-algo-1", 30)})


def test_the_rank_that_stopped_stepping_is_named(trainprof_bin, tmp_path):
    root = tmp_path / "job"
    two_ranks(root)
    # The agent's record of the host at the stall (docs/on-disk.md, "Host state at a stall").
    host = root / "system" / "hangs" / "0-algo-1"
    host.mkdir(parents=True)
    (host / f"30-{DETECTED}.json").write_text(json.dumps({
        "version": 1, "node": "0-algo-1", "trigger": "dump", "folder": f"0-algo-1/30-{DETECTED}",
        "detected_us": DETECTED, "trainer_cpu_state": "asleep", "trainer_threads": {"S": 3},
        "samples": [{"t_s": DETECTED / 1e6, "gpus": {"gpu0": [0.0, 12.0]}, "pressure": {"cpu_some": 0.5}}]}))
    page = tmp_path / "report.html"
    m = report(trainprof_bin, root, page)
    hangs = m["hangs"]
    assert hangs["folders_left_out"] == 0
    [inc] = hangs["incidents"]
    assert inc["kind"] == "stall" and inc["step"] == 30 and inc["mode"] == "train"
    assert inc["culprits"] == ["1-algo-1"]
    assert inc["reason"] == "lowest_step"
    assert inc["ended_s"] is None and inc["stalled_s"] is None
    ranks = {r["rank"]: r for r in inc["ranks"]}
    assert ranks["0-algo-1"]["last_completed_step"] == 29 and ranks["0-algo-1"]["last_begun_step"] == 30
    assert ranks["0-algo-1"]["begun_from"] == "dump" and ranks["0-algo-1"]["dumped"]
    assert ranks["0-algo-1"]["top_frames"] == ["/job/train.py:41 in wait_for_peer"]
    assert ranks["1-algo-1"]["last_completed_step"] == 29 and ranks["1-algo-1"]["last_begun_step"] == 29
    assert ranks["1-algo-1"]["culprit"] and not ranks["1-algo-1"]["dumped"]
    assert any("1-algo-1: last begun step 29" in e for e in inc["evidence"]), inc["evidence"]
    [dump] = inc["dumps"]
    main = [t for t in dump["python"] if t["id"] == "0x00007f0000000001"][0]
    assert main["frames"][0] == "/job/train.py:41 in wait_for_peer"
    assert dump["native"][0]["frames"] == ["read", "_Py_read"]
    assert inc["host"][0]["trainer_cpu_state"] == "asleep"
    text = page.read_text()
    # The section comes first, before the job's.
    assert text.index('id="hangs"') < text.index('id="job"')
    section = text[text.index('id="hangs"'):text.index('id="job"')]
    assert "Stall in step 30" in section
    assert re.search(r"Likely culprit: <b>1-algo-1</b>", section)
    assert "/job/train.py:41 in wait_for_peer" in section
    assert "read\n_Py_read" in section


def test_an_ended_stall_says_how_long(trainprof_bin, tmp_path):
    root = tmp_path / "job"
    two_ranks(root)
    d = next((root / "framework" / "hangs" / "0-algo-1").iterdir())
    (d / "ended.json").write_text(json.dumps({"ended_us": DETECTED + 2_000_000, "stalled_s": 7.0}))
    m = report(trainprof_bin, root, tmp_path / "r.html")
    [inc] = m["hangs"]["incidents"]
    assert inc["stalled_s"] == 7.0 and inc["ended_s"] == (DETECTED + 2_000_000) / 1e6


def test_a_crash_shows_its_stack(trainprof_bin, tmp_path):
    root = tmp_path / "job"
    write_timeline(root, "0-algo-1", 12)
    # A segfault: the process died before stall.json.
    write_dump(root, "0-algo-1", 12, T0 + 12 * STEP_US + 500, {"python_stacks.txt": (
        "Fatal Python error: Segmentation fault\n\nCurrent thread 0x00007f0000000001 (most recent call first):\n"
        '  File "/usr/lib/python3.12/ctypes/__init__.py", line 517 in string_at\n'
        '  File "/job/crash.py", line 9 in step\n')})
    # An uncaught exception, later.
    write_dump(root, "0-algo-1", 12, T0 + 3_600_000_000, {
        "traceback.txt": 'Traceback (most recent call last):\n  File "/job/raise.py", line 5, in <module>\n'
                         '    step()\nValueError: loss is nan\n',
        "stall.json": stall_json("0-algo-1", 12, kind="exception", detected_us=T0 + 3_600_000_000)})
    page = tmp_path / "r.html"
    m = report(trainprof_bin, root, page)
    fatal, exc = m["hangs"]["incidents"]
    assert fatal["kind"] == "fatal" and fatal["culprits"] == ["0-algo-1"] and fatal["reason"] == "crashed"
    assert not fatal["dumps"][0]["complete"]
    assert fatal["dumps"][0]["python_notes"] == ["Fatal Python error: Segmentation fault"]
    assert fatal["dumps"][0]["python"][0]["frames"][0].endswith("ctypes/__init__.py:517 in string_at")
    assert exc["kind"] == "exception" and exc["dumps"][0]["traceback"][-1] == "ValueError: loss is nan"
    text = page.read_text()
    assert "Crash (fatal error) in step 12" in text
    assert "ctypes/__init__.py:517 in string_at" in text
    assert "ValueError: loss is nan" in text


def test_hostile_names_and_stacks_stay_text(trainprof_bin, tmp_path):
    root = tmp_path / "job"
    evil = "<img src=x onerror=alert(1)>"
    write_timeline(root, "0-algo-1", 5)
    write_dump(root, "0-algo-1", 5, DETECTED, {
        "python_stacks.txt": f'Thread 0x1 (most recent call first):\n  File "{evil}.py", line 1 in <script>f()</script>\n',
        "native_stacks.txt": f"thread 1 {evil}\n  #0 0x1 {evil}\x07\x1b[31m\n",
        "traceback.txt": "x" * 100_000 + "\n" + evil + "\n",
        "stall.json": stall_json("0-algo-1", 5, mode=evil, signal=evil, open_windows=[evil] * 1000,
                                 hook={evil: evil, "big": "y" * 100_000},
                                 ring=[{"t_us": DETECTED, "what": evil, "name": evil, "step": 5}] * 5000)})
    page = tmp_path / "r.html"
    m = report(trainprof_bin, root, page)
    [inc] = m["hangs"]["incidents"]
    d = inc["dumps"][0]
    assert len(d["ring"]) == 256 and len(d["open_windows"]) == 64
    assert all(len(h.encode()) <= 520 for h in d["hook"])
    assert "\x1b" not in json.dumps(d) and "\\u001b" not in json.dumps(d)
    text = page.read_text()
    assert "<img" not in text and "<script>f()" not in text
    assert html.escape(evil) in text or "&lt;img src=x onerror=alert(1)&gt;" in text


def test_the_trace_has_the_stall_slice(trainprof_bin, tmp_path):
    root = tmp_path / "job"
    two_ranks(root)
    out = tmp_path / "t.json.gz"
    run(trainprof_bin, "trace", root, "-o", out)
    events = json.loads(gzip.decompress(out.read_bytes()))
    stalls = [e for e in events if e.get("cat") == "hang"]
    assert len(stalls) == 1
    s = stalls[0]
    assert s["ph"] == "X" and s["name"] == "stall in step 30"
    assert s["ts"] == STALL_AT and s["dur"] == DETECTED - STALL_AT
    assert s["args"]["folder"] == f"framework/hangs/0-algo-1/30-{DETECTED}"


def test_no_dumps_no_section(trainprof_bin, tmp_path):
    root = tmp_path / "job"
    write_timeline(root, "0-algo-1", 30)
    write_timeline(root, "1-algo-1", 20)
    page = tmp_path / "r.html"
    m = report(trainprof_bin, root, page)
    assert m["hangs"] == {"incidents": [], "folders_left_out": 0}
    assert 'id="hangs"' not in page.read_text()


def test_docs_name_every_key(trainprof_bin, tmp_path):
    """Every key of `hangs` in --json is named in docs/report.md's "Hangs and crashes"."""
    root = tmp_path / "job"
    two_ranks(root)
    host = root / "system" / "hangs" / "0-algo-1"
    host.mkdir(parents=True)
    (host / "x.json").write_text(json.dumps({"node": "0-algo-1", "trigger": "dump", "detected_us": DETECTED,
                                             "samples": [{"t_s": DETECTED / 1e6}], "busy_threads": [{"tid": 1}]}))
    m = report(trainprof_bin, root, tmp_path / "r.html")
    docs = (pathlib.Path(__file__).resolve().parents[2] / "docs" / "report.md").read_text()
    section = docs[docs.index("### Hangs and crashes"):]
    section = section[:section.index("\n## ")]

    def keys(v, out):
        if isinstance(v, dict):
            for k, x in v.items():
                out.add(k)
                keys(x, out)
        elif isinstance(v, list):
            for x in v:
                keys(x, out)
        return out

    # The host record's maps are empty here: every key found is one of the shape's.
    found = keys(m["hangs"], set())
    named = set(re.findall(r"`(?:[\w\[\].]*\.)?(\w+)(?:\[\])?`", section))
    missing = sorted(found - named)
    assert not missing, missing


def test_the_agent_records_the_host_at_a_stall_under_run(trainprof_bin, tmp_path, fake_nvml):
    """Under `trainprof run`, a new stall dump (written here as the hook would) gets the agent's
    record of the host beside it in `system/hangs/`, never in the trainer's folder; the run's
    report joins it; the trainer's exit status is unchanged."""
    root = tmp_path / "profiler"
    script = r'''
import json, os, sys, threading, time
root = sys.argv[1]
# One thread spins, the main thread sleeps (the spinner starts before the dump is seen).
threading.Thread(target=lambda: [None for _ in iter(int, 1)], daemon=True).start()
time.sleep(0.2)
now = int(time.time() * 1e6)
d = os.path.join(root, "framework", "hangs", "0-algo-1", f"30-{now}")
os.makedirs(d)
open(os.path.join(d, "python_stacks.txt"), "w").write(
    'Thread 0x1 (most recent call first):\n  File "/job/train.py", line 41 in wait_for_peer\n')
json.dump({"version": 1, "kind": "stall", "node": "0-algo-1", "pid": os.getpid(), "mode": "train", "step": 30,
           "step_started_us": now - 5_000_000, "detected_us": now, "threshold_s": 5.0, "median_step_s": 0.01,
           "last_completed_step": 29, "signal": None, "ring": [], "open_windows": [], "hook": {}},
          open(os.path.join(d, ".stall.json.tmp"), "w"))
os.rename(os.path.join(d, ".stall.json.tmp"), os.path.join(d, "stall.json"))
# Planted beside it: folders whose stall.json is not the hook's record get no host record.
for i, body in enumerate(["", "{}", '{"kind": "stall", "threshold_s": NaN}']):
    p = os.path.join(root, "framework", "hangs", "0-algo-1", f"{31 + i}-{now + i + 1}")
    os.makedirs(p)
    open(os.path.join(p, "stall.json"), "w").write(body)
# Alive until the agent's record of the host is there (it is written while the trainer runs,
# at least 1 s after the agent saw the dump); 60 s is only the failure bound.
record = os.path.join(root, "system", "hangs", "0-algo-1", f"30-{now}.json")
t0 = time.monotonic()
while not os.path.exists(record) and time.monotonic() - t0 < 60:
    time.sleep(0.05)
sys.exit(3)
'''
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TRAINPROF_", "SMPROFILER_"))}
    env["TRAINPROF_NVML_LIB"] = str(fake_nvml)  # two fake GPUs (agent/tests/c/fake_nvml.c)
    env["TRAINPROF_RESOURCE_CONFIG"] = str(tmp_path / "no-resourceconfig.json")
    env["SMPROFILER_CONFIG_PATH"] = str(tmp_path / "no-profilerconfig.json")
    t0 = time.time()
    proc = subprocess.run(
        [str(trainprof_bin), "run", "--interval-ms", "100", "--local-path", str(root), "--",
         sys.executable, "-c", script, str(root)],
        env=env, capture_output=True, text=True, timeout=180)
    assert proc.returncode == 3, proc.stderr
    [folder] = list((root / "framework" / "hangs" / "0-algo-1").glob("30-*"))
    assert sorted(p.name for p in folder.iterdir()) == ["python_stacks.txt", "stall.json"]
    rec = root / "system" / "hangs" / "0-algo-1" / f"{folder.name}.json"
    assert rec.is_file(), proc.stderr
    assert [p.name for p in rec.parent.iterdir()] == [rec.name], "a record for a planted folder"
    h = json.loads(rec.read_text())
    assert h["trigger"] == "dump" and h["folder"] == f"0-algo-1/{folder.name}"
    assert h["detected_us"] >= int(t0 * 1e6)
    assert sum(h["trainer_threads"].values()) >= 2, h
    # The spinner: running at the detection, and the busiest thread after it.
    assert h["trainer_cpu_state"] == "busy", h
    assert h["busy_threads"][0]["cpu_pct"] > 5, h
    assert h["samples"] and all("t_s" in s for s in h["samples"])
    last = h["samples"][-1]
    assert sorted(last["gpus"]) == ["gpu0", "gpu1"], last
    assert any(k.endswith(":XidEvents") for k in last["gpu_errors"]), last
    assert last["cpu_total"] is not None, last
    if pathlib.Path("/proc/pressure/cpu").exists():
        assert last["pressure"], last
    m = report(trainprof_bin, root, tmp_path / "r.html")
    [inc] = [i for i in m["hangs"]["incidents"] if i["host"]]
    assert inc["host"][0]["folder"] == h["folder"]
    # The empty and the NaN stall.json: incomplete dumps, not crashes.
    kinds = sorted(i["kind"] for i in m["hangs"]["incidents"] if not i["host"])
    assert kinds == ["incomplete", "incomplete", "stall"], kinds
    assert "The host of 0-algo-1 around it" in (tmp_path / "r.html").read_text()


RANK_SCRIPT = r'''
import os, sys, time
import trainprof
rank, fd = int(os.environ["RANK"]), int(sys.argv[1])
prof = trainprof.Profiler(framework="pytorch")
for step in range(40 if rank == 0 else 30):
    prof.step_begin("train")
    time.sleep(0.005)
    if rank == 0:
        os.read(fd, 1)  # the "collective": waits for rank 1's byte of this step
    else:
        os.write(fd, b"x")
    prof.step_end()
if rank == 1:
    # Rank 1 stops stepping after step 29 (outside a step, so its own watchdog sees nothing),
    # then lets rank 0 finish once the agent has recorded the host at rank 0's dump (written
    # at least 1 s after the agent saw the dump, itself at least HangTimeoutS into the stall);
    # 60 s is only the failure bound.
    hangs = os.path.join(os.environ["HANG_TEST_ROOT"], "system", "hangs")
    t0 = time.monotonic()
    while time.monotonic() - t0 < 60 and not any(
            f.endswith(".json") for _, _, fs in os.walk(hangs) for f in fs):
        time.sleep(0.05)
    os.write(fd, b"x" * 10)
prof.close()
'''

LAUNCHER = r'''
import os, subprocess, sys
r, w = os.pipe()
procs = [subprocess.Popen([sys.executable, "-c", sys.argv[1], str(fd)], env=dict(os.environ, RANK=str(rank)),
                          pass_fds=(fd,)) for rank, fd in ((0, r), (1, w))]
os.close(r)
os.close(w)
codes = [p.wait() for p in procs]
print("ranks exited", codes, flush=True)
sys.exit(4 if codes == [0, 0] else 9)
'''


def test_two_ranks_under_run_name_the_one_that_stopped(trainprof_bin, hook_lib, tmp_path):
    """Two real trainers under `trainprof run`, a pipe standing in for a collective: rank 1
    stops stepping after step 29, rank 0 waits in its step 30 (the hook's watchdog dumps it,
    HangTimeoutS 1). The report names rank 1 and step 30; the stall ended; the exit status is
    the launcher's."""
    root = tmp_path / "profiler"
    cfg = tmp_path / "profilerconfig.json"
    cfg.write_text(json.dumps({"ProfilingParameters": {
        "LocalPath": str(root), "HangDetectionConfig": json.dumps({"HangTimeoutS": 1})}}))
    drop = ("TRAINPROF_", "SMPROFILER_", "RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "MV2_COMM_WORLD_RANK",
            "SLURM_PROCID", "PYTHONPATH")
    env = {k: v for k, v in os.environ.items() if not k.startswith(drop)}
    env.update(SMPROFILER_CONFIG_PATH=str(cfg), TRAINPROF_HOOK_LIB=str(hook_lib), HANG_TEST_ROOT=str(root),
               PYTHONPATH=str(pathlib.Path(__file__).resolve().parents[2] / "hook-ffi" / "python"),
               TRAINPROF_NVML_LIB=str(tmp_path / "no-libnvidia-ml.so.1"),
               TRAINPROF_RESOURCE_CONFIG=str(tmp_path / "no-resourceconfig.json"))
    proc = subprocess.run([str(trainprof_bin), "run", "--", sys.executable, "-c", LAUNCHER, RANK_SCRIPT],
                          env=env, capture_output=True, text=True, timeout=180)
    assert proc.returncode == 4, proc.stdout + proc.stderr
    assert "ranks exited [0, 0]" in proc.stdout
    [d] = list((root / "framework" / "hangs").glob("*/*/stall.json"))
    # The node ids are `<rank>-<host>` (the host as the hook names it here).
    r0 = d.parent.parent.name
    assert r0.startswith("0-") and d.parent.name.startswith("30-")
    r1 = "1-" + r0[2:]
    m = report(trainprof_bin, root, tmp_path / "r.html")
    [inc] = m["hangs"]["incidents"]
    assert (inc["kind"], inc["step"]) == ("stall", 30)
    assert inc["culprits"] == [r1], inc["evidence"]
    assert inc["reason"] == "lowest_step"
    assert 2 <= inc["stalled_s"] < 30, inc
    ranks = {r["rank"]: r for r in inc["ranks"]}
    assert ranks[r1]["last_completed_step"] == 29 and not ranks[r1]["dumped"]
    assert ranks[r0]["last_begun_step"] == 30 and ranks[r0]["last_completed_step"] == 29
    # Where rank 0 waits: the script's `os.read` line (the launcher runs it with `-c`).
    assert ranks[r0]["top_frames"] == ["<string>:10 in <module>"], ranks[r0]
    main = [t for t in inc["dumps"][0]["python"] if any("<string>" in f for f in t["frames"])]
    assert main and main[0]["frames"][0].startswith("<string>:"), inc["dumps"][0]["python"]
    # The agent recorded the host beside it, in its own output.
    assert inc["host"] and inc["host"][0]["trigger"] == "dump", proc.stderr
    assert inc["host"][0]["trainer_threads"], proc.stdout + proc.stderr
    text = (tmp_path / "r.html").read_text()
    assert f"Likely culprit: <b>{r1}</b>" in text
    # The page `run` made at its end says the same.
    pages = list(root.glob("report*.html"))
    assert pages and f"Likely culprit: <b>{r1}</b>" in pages[0].read_text()


def hang_trainer(tmp_path, hook_lib, how, **params):
    """tests/hook/scripts/hang_trainer.py run with HangDetectionConfig (HangTimeoutS 1)."""
    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
    from trainer_runs import run_script

    work = tmp_path / how
    work.mkdir()
    script = pathlib.Path(__file__).resolve().parents[1] / "hook" / "scripts" / "hang_trainer.py"
    return run_script(work, script, hook_lib, dict(params, how=how), {"HangDetectionConfig": {"HangTimeoutS": 1}},
                      timeout=90)


def test_a_real_lock_deadlock_is_named_with_its_acquire_line(trainprof_bin, hook_lib, tmp_path):
    run = hang_trainer(tmp_path, hook_lib, "lock", release_s=3.0)
    assert run.proc.returncode == 0, run.proc.stderr
    page = tmp_path / "r.html"
    m = report(trainprof_bin, run.out, page)
    [inc] = m["hangs"]["incidents"]
    assert (inc["kind"], inc["step"], inc["mode"]) == ("stall", 30, "train")
    assert 2.0 <= inc["stalled_s"] < 10
    [rank] = inc["ranks"]
    assert (rank["last_completed_step"], rank["last_begun_step"]) == (29, 30)
    assert any("hang_trainer.py" in f and "in go_wrong" in f for f in rank["top_frames"]), rank
    text = page.read_text()
    assert "Stall in step 30" in text and "in go_wrong" in text


def test_real_crashes_show_their_stacks(trainprof_bin, hook_lib, tmp_path):
    segv = hang_trainer(tmp_path, hook_lib, "segv")
    assert segv.proc.returncode == -11
    page = tmp_path / "segv.html"
    m = report(trainprof_bin, segv.out, page)
    [inc] = m["hangs"]["incidents"]
    assert (inc["kind"], inc["step"], inc["reason"]) == ("fatal", 30, "crashed")
    assert "SIGSEGV" in inc["evidence"][0]
    frames = [f for t in inc["dumps"][0]["python"] for f in t["frames"]]
    assert any("in string_at" in f for f in frames), frames
    assert "in string_at" in page.read_text()
    exc = hang_trainer(tmp_path, hook_lib, "raise")
    assert exc.proc.returncode == 1
    page = tmp_path / "raise.html"
    m = report(trainprof_bin, exc.out, page)
    [inc] = m["hangs"]["incidents"]
    assert inc["kind"] == "exception"
    assert inc["dumps"][0]["traceback"][-1] == "RuntimeError: boom in step 30"
    assert "RuntimeError: boom in step 30" in page.read_text()
