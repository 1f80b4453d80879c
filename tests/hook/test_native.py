"""Native CPU sampling (docs/formats.md "Native profiling"): the pprof protobuf and the
flamegraph of a window, a trainer's own SIGPROF handler kept, and the LD_PRELOAD path
(TRAINPROF_AUTOSTART) for a program with no trainprof calls; without the variable nothing
runs at load.

The profiles are read back with a minimal protobuf decoder written here (the pprof
`profile.proto` field numbers), so the test depends on no generated code."""

import gzip
import json
import os
import shutil
import subprocess
import time

import pytest
from conftest import SCRIPTS
from trainer_runs import CLEARED_ENV

C_DIR = SCRIPTS.parent / "c"
HOT = "trainprof_hot_c_loop"
BUSY = "trainprof_busy_native_loop"


# --- a minimal protobuf reader, enough for pprof's Profile ---------------------------------


def _varint(buf, i):
    shift = result = 0
    while True:
        b = buf[i]
        i += 1
        result |= (b & 0x7F) << shift
        if b < 0x80:
            return result, i
        shift += 7


def fields(buf):
    """{field number: [values]}: ints for varints, bytes for length-delimited fields."""
    out, i = {}, 0
    while i < len(buf):
        key, i = _varint(buf, i)
        num, wire = key >> 3, key & 7
        if wire == 0:
            v, i = _varint(buf, i)
        elif wire == 2:
            n, i = _varint(buf, i)
            v, i = bytes(buf[i : i + n]), i + n
        elif wire == 1:
            v, i = int.from_bytes(buf[i : i + 8], "little"), i + 8
        elif wire == 5:
            v, i = int.from_bytes(buf[i : i + 4], "little"), i + 4
        else:
            raise ValueError(f"wire type {wire}")
        out.setdefault(num, []).append(v)
    return out


def ints(values):
    """A repeated integer field, packed (bytes) or not."""
    out = []
    for v in values:
        if isinstance(v, bytes):
            i = 0
            while i < len(v):
                x, i = _varint(v, i)
                out.append(x)
        else:
            out.append(v)
    return out


def read_profile(path):
    """(samples, total): samples = [(function names leaf first, count)]."""
    prof = fields(gzip.decompress(path.read_bytes()))
    strings = [s.decode() for s in prof.get(6, [])]
    functions = {}
    for f in prof.get(5, []):
        f = fields(f)
        functions[f[1][0]] = strings[f.get(2, [0])[0]]
    locations = {}
    for loc in prof.get(4, []):
        loc = fields(loc)
        names = [functions.get(fields(line).get(1, [0])[0], "?") for line in loc.get(4, [])]
        locations[loc[1][0]] = names
    samples = []
    for s in prof.get(2, []):
        s = fields(s)
        stack = [name for lid in ints(s.get(1, [])) for name in locations.get(lid, ["?"])]
        samples.append((stack, ints(s.get(2, []))[0]))
    return samples, sum(c for _, c in samples)


def self_counts(samples):
    """Samples per leaf function (the hook leaves the sampler's own frames out)."""
    counts = {}
    for stack, n in samples:
        leaf = stack[0] if stack else "?"
        counts[leaf] = counts.get(leaf, 0) + n
    return sorted(counts.items(), key=lambda kv: -kv[1])


def windows(out):
    base = out / "framework" / "native"
    if not base.exists():
        return []
    return sorted(w for node in base.iterdir() for w in node.iterdir())


def cc(tmp_path, src, out, shared):
    name = "c++" if src.endswith(".cpp") else "cc"
    compiler = shutil.which(name)
    if compiler is None:
        pytest.fail(f"no compiler ({name}) on PATH")
    args = [compiler, "-O1", "-pthread", "-o", str(tmp_path / out), str(C_DIR / src)]
    if shared:
        args[1:1] = ["-shared", "-fPIC"]
    subprocess.run(args, check=True)
    return tmp_path / out


# --- the Python trainer with a C hot loop --------------------------------------------------


def test_a_c_hot_loop_is_the_heaviest_frame(run_script, tmp_path):
    hot = cc(tmp_path, "hot_loop.c", "libhot.so", shared=True)
    native = {"StartStep": 3, "NumSteps": 6, "SamplingHz": 199}
    r = run_script(
        "native_trainer.py",
        {"hot_lib": str(hot), "steps": 12, "cpu_ms": 60, "settle_s": 5},
        config={"NativeProfilingConfig": native},
    ).check()
    found = windows(r.out)
    assert len(found) == 1, (found, r.proc.stderr)
    w = found[0]
    assert w.parent.parent == r.out / "framework" / "native"
    assert w.name.endswith("_%d" % r.manifest["pid"])
    assert sorted(p.name for p in w.iterdir()) == ["flamegraph.svg", "profile.pb.gz"]
    samples, total = read_profile(w / "profile.pb.gz")
    # 6 steps × 60 ms of CPU at 199 Hz is about 70 samples; the kernel's CPU-time ticks
    # may deliver fewer on a loaded machine.
    assert total >= 10, (total, r.proc.stderr)
    top = self_counts(samples)
    assert top[0][0] == HOT, top[:5]
    assert top[0][1] >= total // 2, top[:5]
    assert HOT in (w / "flamegraph.svg").read_text()
    assert "native profiling: window opened (199 Hz)" in r.proc.stderr
    assert "native profiling: %d samples in framework/native/" % total in r.proc.stderr


def test_cpp_names_are_demangled_in_the_profile_and_the_flamegraph(run_script, tmp_path, trainprof_bin):
    # The hot loop is a C++ member function: both files name it as C++ spells it, not as
    # the linker does (docs/formats.md "Native profiling", the `cpp` feature of pprof).
    hot = cc(tmp_path, "hot_loop.cpp", "libhotcpp.so", shared=True)
    native = {"StartStep": 3, "NumSteps": 6, "SamplingHz": 199}
    r = run_script(
        "native_trainer.py",
        {"hot_lib": str(hot), "steps": 12, "cpu_ms": 60, "settle_s": 5},
        config={"NativeProfilingConfig": native},
    ).check()
    found = windows(r.out)
    assert len(found) == 1, (found, r.proc.stderr)
    samples, total = read_profile(found[0] / "profile.pb.gz")
    assert total >= 10, (total, r.proc.stderr)
    demangled, mangled = "trainprof_test::HotLoop::run(unsigned long)", "_ZN14trainprof_test7HotLoop3runEm"
    top = self_counts(samples)
    assert top[0][0] == demangled, top[:5]
    names = {name for stack, _ in samples for name in stack}
    assert not [n for n in names if n.startswith("_Z")], sorted(names)
    svg = (found[0] / "flamegraph.svg").read_text()
    assert "trainprof_test::HotLoop::run(unsigned long)" in svg and mangled not in svg
    assert "<title>_Z" not in svg
    # `trainprof report` reads the same window from its profile (docs/report.md, "Native
    # windows"): the same samples, the same top function.
    rep = subprocess.run([str(trainprof_bin), "report", str(r.out), "--json"], capture_output=True, text=True,
                         timeout=120)
    assert rep.returncode == 0, rep.stderr
    (w,) = json.loads(rep.stdout)["native"]
    assert (w["window"], w["source"], w["samples"]) == (found[0].name, "profile.pb.gz", total)
    assert (w["top_self"][0]["name"], w["top_self"][0]["self_samples"]) == (demangled, top[0][1])
    assert w["cpu_s"] > 0 and w["samples_left_out"] == 0


def test_a_child_forked_in_a_window_leaves_the_parents_profile_alone(run_script, tmp_path):
    # A child that stopped the profiler it inherited would delete the parent's temporary
    # sample file, and the parent's report would fail (docs/formats.md "Native profiling").
    hot = cc(tmp_path, "hot_loop.c", "libhot.so", shared=True)
    native = {"StartStep": 2, "NumSteps": 6}
    r = run_script(
        "native_trainer.py",
        {"hot_lib": str(hot), "steps": 10, "cpu_ms": 40, "settle_s": 5, "fork_at": 4},
        config={"NativeProfilingConfig": native},
    ).check()
    assert r.manifest["child_status"] == 0
    found = windows(r.out)
    assert len(found) == 1, (found, r.proc.stderr)
    assert found[0].name.endswith("_%d" % r.manifest["pid"])
    samples, total = read_profile(found[0] / "profile.pb.gz")
    assert total >= 5 and self_counts(samples)[0][0] == HOT, (total, r.proc.stderr)
    assert "cannot" not in r.proc.stderr, r.proc.stderr


def test_a_window_stops_at_its_sample_cap_and_says_so(run_script, tmp_path):
    """``WindowCapsConfig.NativeMaxSamples`` (docs/formats.md, "Window caps"): 60 ms of CPU a
    step at 199 Hz is about 12 samples a step, so a cap of 10 stops the six-step window
    within a step or two of its opening; what it took is written, no second window opens in its range, and
    one ``trainprof:WindowCapped`` event says so."""
    from test_auto_profiling import timeline

    hot = cc(tmp_path, "hot_loop.c", "libhot.so", shared=True)
    native = {"StartStep": 3, "NumSteps": 6, "SamplingHz": 199}
    r = run_script(
        "native_trainer.py",
        {"hot_lib": str(hot), "steps": 12, "cpu_ms": 60, "settle_s": 5},
        config={"NativeProfilingConfig": native, "WindowCapsConfig": {"NativeMaxSamples": 10}},
    ).check()
    found = windows(r.out)
    assert len(found) == 1, (found, r.proc.stderr)
    _, total = read_profile(found[0] / "profile.pb.gz")
    assert 1 <= total < 40, (total, r.proc.stderr)
    capped = [e for e in timeline(r.out) if e.get("name") == "trainprof:WindowCapped"]
    assert len(capped) == 1, capped
    a = capped[0]["args"]
    assert (a["feature"], a["cap"], a["limit"]) == ("native", "samples", 10), a
    # Inside the window's range (its first step can be late: the sampler opens it once its
    # warm-up is over).
    assert 10 <= a["value"] < 40 and 3 <= a["step"] <= 8, a
    assert r.proc.stderr.count("the native window stopped at its cap") == 1, r.proc.stderr
    assert r.proc.stderr.count("native profiling: window opened") == 1, r.proc.stderr


def test_outside_the_window_nothing_is_sampled(run_script, tmp_path):
    hot = cc(tmp_path, "hot_loop.c", "libhot.so", shared=True)
    native = {"StartStep": 50, "NumSteps": 2}
    r = run_script(
        "native_trainer.py", {"hot_lib": str(hot), "steps": 4, "cpu_ms": 20}, config={"NativeProfilingConfig": native}
    ).check()
    assert windows(r.out) == []
    lines = [line for line in r.proc.stderr.splitlines() if "native profiling" in line]
    assert len(lines) == 1 and "native profiling: sampler ready" in lines[0], r.proc.stderr


def test_a_trainer_sigprof_handler_is_kept(run_script, tmp_path):
    hot = cc(tmp_path, "hot_loop.c", "libhot.so", shared=True)
    native = {"StartStep": 1, "NumSteps": 2}
    r = run_script(
        "native_trainer.py",
        {"hot_lib": str(hot), "steps": 5, "cpu_ms": 20, "own_sigprof": True, "settle_s": 5},
        config={"NativeProfilingConfig": native},
    ).check()
    m = r.manifest
    assert m["handler_kept"] is True
    assert m["handler_calls"] == 1
    refused = [line for line in r.proc.stderr.splitlines() if "native profiling" in line and "sampler ready" not in line]
    assert len(refused) == 1, r.proc.stderr
    assert refused[0].endswith(
        "native profiling refused: the process already has its own SIGPROF handler (kept); the feature is off"
    )
    assert windows(r.out) == []


# --- LD_PRELOAD ------------------------------------------------------------------------------


def preload_env(tmp_path, hook_lib, **extra):
    e = {k: v for k, v in os.environ.items() if k not in CLEARED_ENV and not k.startswith("TRAINPROF_")}
    e["LD_PRELOAD"] = str(hook_lib)
    e["TRAINPROF_RESOURCE_CONFIG"] = str(tmp_path / "no-resourceconfig.json")
    e["SMPROFILER_CONFIG_PATH"] = str(tmp_path / "no-config.json")
    e.update({k: str(v) for k, v in extra.items()})
    return e


@pytest.mark.parametrize("where", ["main", "thread"])
def test_ld_preload_profiles_a_plain_c_program_in_a_time_window(tmp_path, hook_lib, where):
    # "thread": the busy loop runs in a second thread while main waits in pthread_join; the
    # samples must come from the busy thread (each thread has its own CPU-time timer).
    busy = cc(tmp_path, "busy.c", "busy", shared=False)
    out = tmp_path / "out"
    # The window opens 5 s after the start: room for the sampler thread's one-time warm-up
    # (up to 3 s in a debug build on a loaded machine, 6 s seen with a load average of 12;
    # docs/formats.md "Native profiling"); a window that opens during it starts when it ends.
    native = {"StartTimeInSecSinceEpoch": time.time() + 5.0, "Duration": 4.0}
    config = tmp_path / "profilerconfig.json"
    config.write_text(json.dumps({"ProfilingParameters": {"LocalPath": str(out), "NativeProfilingConfig": native}}))
    env = preload_env(tmp_path, hook_lib, TRAINPROF_AUTOSTART="1", SMPROFILER_CONFIG_PATH=config)
    proc = subprocess.run([str(busy), "10", where], env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    # The writer and the sampler thread run beside main (the positive control of the
    # test below).
    assert int(proc.stdout.split()[1]) >= 2, proc.stdout
    found = windows(out)
    assert len(found) == 1, (found, proc.stderr)
    samples, total = read_profile(found[0] / "profile.pb.gz")
    assert total >= 5, (total, proc.stderr)
    top = self_counts(samples)
    assert top[0][0] == BUSY, top[:5]
    assert BUSY in (found[0] / "flamegraph.svg").read_text()


@pytest.mark.parametrize("autostart", [None, "0", "maybe"])
def test_without_the_variable_nothing_runs_at_load(tmp_path, hook_lib, autostart):
    busy = cc(tmp_path, "busy.c", "busy", shared=False)
    out = tmp_path / "out"
    native = {"StartTimeInSecSinceEpoch": time.time(), "Duration": 5.0}
    config = tmp_path / "profilerconfig.json"
    config.write_text(json.dumps({"ProfilingParameters": {"LocalPath": str(out), "NativeProfilingConfig": native}}))
    extra = {"SMPROFILER_CONFIG_PATH": config}
    if autostart is not None:
        extra["TRAINPROF_AUTOSTART"] = autostart
    proc = subprocess.run(
        [str(busy), "0.3"], env=preload_env(tmp_path, hook_lib, **extra), capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split()[:2] == ["tasks", "1"], proc.stdout
    assert not out.exists()
    lines = [line for line in proc.stderr.splitlines() if line.startswith("trainprof-hook")]
    if autostart == "maybe":
        assert len(lines) == 1 and "TRAINPROF_AUTOSTART=\"maybe\" is not 1, 0 or a framework name" in lines[0], proc.stderr
    else:
        assert lines == [], proc.stderr


# --- exec inside a window --------------------------------------------------------------------

# The new program burns about 0.3 s of CPU, then exits 7: at SamplingHz 499 a timer that
# exec carried over would have fired dozens of times by then, and with no handler in the
# new program SIGPROF kills it ("Profiling timer expired", status 155 from the shell).
EXEC_ARGS = ["/bin/sh", "-c", "i=0; while [ $i -lt 200000 ]; do i=$((i+1)); done; exit 7"]


@pytest.mark.parametrize("how", ["exec", "fork"])
def test_a_program_execd_inside_a_window_runs_to_its_end(tmp_path, hook_lib, how):
    # `exec`: the process itself execs inside the window (an interval timer would survive
    # it); `fork`: a child forked inside the window execs (a child inherits no timer).
    prog = cc(tmp_path, "exec_in_window.c", "exec_in_window", shared=False)
    out = tmp_path / "out"
    native = {"StartTimeInSecSinceEpoch": time.time(), "Duration": 60.0, "SamplingHz": 499}
    config = tmp_path / "profilerconfig.json"
    config.write_text(json.dumps({"ProfilingParameters": {"LocalPath": str(out), "NativeProfilingConfig": native}}))
    env = preload_env(tmp_path, hook_lib, TRAINPROF_AUTOSTART="1", SMPROFILER_CONFIG_PATH=config)
    proc = subprocess.run([str(prog), how, *EXEC_ARGS], env=env, capture_output=True, text=True, timeout=90)
    assert proc.returncode == 7, (proc.returncode, proc.stdout, proc.stderr)
    assert "native profiling: window opened (499 Hz)" in proc.stderr, proc.stderr
    if how == "fork":
        # The parent went on sampling and wrote its window at exit.
        assert proc.stdout.split() == ["child", "7"], proc.stdout
        found = windows(out)
        assert len(found) == 1, (found, proc.stderr)
        samples, total = read_profile(found[0] / "profile.pb.gz")
        assert total >= 5 and "trainprof_exec_burn" in [s[0] for s, _ in samples if s], (total, proc.stderr)


@pytest.mark.parametrize("how", ["execv", "fork-execv"])
def test_a_python_trainer_that_execs_inside_a_window(run_script, tmp_path, how):
    hot = cc(tmp_path, "hot_loop.c", "libhot.so", shared=True)
    native = {"StartStep": 2, "NumSteps": 10, "SamplingHz": 499}
    params = {"hot_lib": str(hot), "steps": 8, "cpu_ms": 40, "settle_s": 5, "exec_at": 5, "exec_args": EXEC_ARGS}
    params["exec_how"] = how
    r = run_script("native_trainer.py", params, config={"NativeProfilingConfig": native})
    assert r.proc.returncode == (7 if how == "execv" else 0), (r.proc.returncode, r.proc.stderr)
    assert "native profiling: window opened (499 Hz)" in r.proc.stderr, r.proc.stderr
    if how == "fork-execv":
        assert r.manifest["child_status"] == 7 << 8
        assert len(windows(r.out)) == 1, r.proc.stderr
