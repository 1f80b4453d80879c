"""A CPU training loop through trainprof.torch that opens windows of every kind, one after
the other, and records the process's state before the first and after each one: what a
window may change and must put back. Run in a subprocess by
tests/hook/test_windows_leave_nothing.py and scripts/bench-windows.

Each window gets its own config (written over SMPROFILER_CONFIG_PATH atomically, then a
pause for the hook's hot reload, docs/formats.md "Hot reload") with only that window, a few
steps ahead. The model is a small torch.nn model when torch is importable (the detailed
window then runs torch.profiler too), else an object with the module protocol the adapter
uses (forward hooks, named_modules), so that the adapter's hooks are still counted.

TRAINPROF_TEST_PARAMS (JSON):
  kinds          window kinds in order, each once per round (default all of
                 detailed, dataloader, cprofile, pyinstrument, native)
  rounds         rounds (default 1)
  hot_lib        tests/hook/c/hot_loop.c built as a library: each step's work (else Python)
  cpu_ms         CPU time of a step's work, in ms (default 10)
  measure_steps  steps timed before the first window and after the last (default 0)
  exit_in        "native": exit (sys.exit, atexit runs) inside a native window, the only one
  native_hz      SamplingHz of the native windows (default 99)

The manifest gets "before" (the state after the warm-up steps), "after" ([kind, round,
state] after each window had closed), the windows seen ([kind, round, most model hooks
during it]), and with measure_steps the median step time (wall and this thread's CPU)
before the first window and after the last.
"""

import ctypes
import json
import os
import re
import statistics
import sys
import threading
import time

import trainprof
import trainprof.torch

PARAMS = json.loads(os.environ.get("TRAINPROF_TEST_PARAMS") or "{}")
MANIFEST = os.environ["TRAINPROF_TEST_MANIFEST"]
CONFIG = os.environ["SMPROFILER_CONFIG_PATH"]
KINDS = PARAMS.get("kinds") or ["detailed", "dataloader", "cprofile", "pyinstrument", "native"]

try:
    import torch
except ImportError:
    torch = None

# --- the process state a window may touch ------------------------------------------------

_libc = ctypes.CDLL(None, use_errno=True)
SIGPROF = 27
ITIMER_PROF = 2


class _Sigaction(ctypes.Structure):
    # glibc's struct sigaction on Linux: handler, mask (1024 bits), flags, restorer.
    _fields_ = [
        ("handler", ctypes.c_void_p),
        ("mask", ctypes.c_ulong * 16),
        ("flags", ctypes.c_int),
        ("restorer", ctypes.c_void_p),
    ]


class _Timeval(ctypes.Structure):
    _fields_ = [("sec", ctypes.c_long), ("usec", ctypes.c_long)]


class _Itimerval(ctypes.Structure):
    _fields_ = [("interval", _Timeval), ("value", _Timeval)]


def sigprof():
    """SIGPROF's disposition as sigaction reads it (signal.getsignal cannot see a handler
    installed from C, nor tell SIG_IGN set from C)."""
    sa = _Sigaction()
    if _libc.sigaction(SIGPROF, None, ctypes.byref(sa)) != 0:
        return "error %d" % ctypes.get_errno()
    # Linux has 64 signals: the first word of the mask is all the kernel fills in.
    return {"handler": sa.handler or 0, "mask": sa.mask[0], "flags": sa.flags}


def itimer_prof():
    t = _Itimerval()
    _libc.getitimer(ITIMER_PROF, ctypes.byref(t))
    return [t.interval.sec, t.interval.usec, t.value.sec, t.value.usec]


def posix_timers():
    """The process's POSIX timers (/proc/self/timers)."""
    try:
        with open("/proc/self/timers") as f:
            return f.read()
    except OSError as e:
        return "unreadable: %s" % e


def tasks():
    """Thread names (comm) of every thread of the process, sorted."""
    names = []
    for tid in os.listdir("/proc/self/task"):
        try:
            with open("/proc/self/task/%s/comm" % tid) as f:
                names.append(f.read().strip())
        except OSError:
            pass
    return sorted(names)


def fds(local_path):
    """Open descriptors by what they point at; the numbers in the names the hook writes in
    LocalPath (a timeline rotates to a new name) are left out."""
    out = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink("/proc/self/fd/" + fd)
        except OSError:
            continue  # the directory listing's own descriptor, closed by now
        if target.startswith(local_path):
            target = re.sub(r"\d+", "N", target)
        out.append(target)
    return sorted(out)


def hook_count(model):
    if torch is not None:
        return sum(len(m._forward_hooks) + len(m._forward_pre_hooks) for m in model.modules())
    return sum(m.hook_count() for _, m in model.named_modules())


def state(model, local_path):
    s = {
        "sys.getprofile": repr(sys.getprofile()),
        "sys.gettrace": repr(sys.gettrace()),
        "threading.getprofile": repr(threading.getprofile()) if hasattr(threading, "getprofile") else None,
        "threading.gettrace": repr(threading.gettrace()) if hasattr(threading, "gettrace") else None,
        "sigprof": sigprof(),
        "itimer_prof": itimer_prof(),
        "posix_timers": posix_timers(),
        "threads": sorted(t.name for t in threading.enumerate()),
        "tasks": tasks(),
        "fds": fds(local_path),
        "tmpdir": sorted(os.listdir(os.environ["TMPDIR"])) if os.environ.get("TMPDIR") else None,
        "model_hooks": hook_count(model),
    }
    if hasattr(sys, "monitoring"):  # cProfile uses sys.monitoring from Python 3.12
        s["sys.monitoring profiler tool"] = sys.monitoring.get_tool(sys.monitoring.PROFILER_ID)
    if torch is not None:
        s["torch profiler enabled"] = bool(torch.autograd.profiler._is_profiler_enabled)
    return s


# --- the model, the loader, the work -------------------------------------------------------


class _Handle:
    def __init__(self, hooks, key):
        self._hooks, self._key = hooks, key

    def remove(self):
        self._hooks.pop(self._key, None)


class DuckModule:
    """What trainprof.torch uses of a torch.nn.Module (without torch installed)."""

    _keys = iter(range(1 << 62))

    def __init__(self, **children):
        self.children = children
        self.training = True
        self.pre, self.post = {}, {}

    def register_forward_pre_hook(self, hook):
        k = next(self._keys)
        self.pre[k] = hook
        return _Handle(self.pre, k)

    def register_forward_hook(self, hook):
        k = next(self._keys)
        self.post[k] = hook
        return _Handle(self.post, k)

    def named_modules(self, prefix=""):
        yield prefix, self
        for name, child in self.children.items():
            yield from child.named_modules(prefix + ("." if prefix else "") + name)

    def hook_count(self):
        return len(self.pre) + len(self.post)

    def __call__(self, x):
        for h in list(self.pre.values()):
            h(self, (x,))
        for child in self.children.values():
            x = child(x)
        for h in list(self.post.values()):
            h(self, (x,), x)
        return x


def make_model():
    if torch is not None:
        torch.manual_seed(0)
        return torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 8))
    return DuckModule(fc1=DuckModule(), act=DuckModule(), fc2=DuckModule())


class Loader:
    """An endless loader of one batch, with a DataLoader's attributes."""

    num_workers = 0
    pin_memory = False

    def __init__(self):
        self.batch = torch.randn(16, 64) if torch is not None else 0

    def __iter__(self):
        while True:
            yield self.batch


if PARAMS.get("hot_lib"):
    _hot = ctypes.CDLL(PARAMS["hot_lib"])
    _hot.trainprof_hot_c_loop.argtypes = [ctypes.c_ulong]
    _hot.trainprof_hot_c_loop.restype = ctypes.c_ulong
    work = _hot.trainprof_hot_c_loop
else:

    def work(n):
        acc = 1
        for i in range(n):
            acc = (acc * 31 + i) & 0xFFFFFFFF
        return acc


def calibrate(cpu_ms):
    """Iterations of ``work`` that take about ``cpu_ms`` of this thread's CPU time."""
    n = 10_000
    while True:
        t0 = time.thread_time()
        work(n)
        dt = time.thread_time() - t0
        if dt > 0.02:
            return max(1, int(n * cpu_ms / 1000.0 / dt))
        n *= 2


# --- the loop ---------------------------------------------------------------------------------

model = make_model()
hook = trainprof.torch.attach(model)
batches = iter(trainprof.torch.profile_dataloader(Loader()))
iterations = calibrate(PARAMS.get("cpu_ms", 10))
local_path = hook.profiler.local_path or ""
base_config = json.load(open(CONFIG))
manifest = {"pid": os.getpid(), "torch": torch is not None, "after": [], "windows": []}


def step():
    x = next(batches)
    y = model(x)
    if torch is not None:
        y.sum().backward()
    work(iterations)


def steps(n, times=None):
    """``n`` steps; with ``times``, appends each one's (wall s, this thread's CPU s)."""
    for _ in range(n):
        t0, c0 = time.perf_counter(), time.thread_time()
        step()
        if times is not None:
            times.append((time.perf_counter() - t0, time.thread_time() - c0))


def configure(kind, start, num):
    """Writes a config with only ``kind``'s window at global steps start..start+num-1."""
    window = {"StartStep": start, "NumSteps": num}
    pp = {k: v for k, v in base_config["ProfilingParameters"].items() if not k.endswith("ProfilingConfig")}
    if kind == "detailed":
        pp["DetailedProfilingConfig"] = json.dumps(window)
    elif kind == "dataloader":
        pp["DataloaderProfilingConfig"] = json.dumps(dict(window, MetricsRegex=".*"))
    elif kind in ("cprofile", "pyinstrument"):
        name = "cProfile" if kind == "cprofile" else "pyinstrument"
        pp["PythonProfilingConfig"] = json.dumps(dict(window, ProfilerName=name))
    elif kind == "native":
        pp["NativeProfilingConfig"] = json.dumps(dict(window, SamplingHz=PARAMS.get("native_hz", 99)))
    tmp = CONFIG + ".new"
    with open(tmp, "w") as f:
        json.dump(dict(base_config, ProfilingParameters=pp), f)
    os.replace(tmp, CONFIG)
    time.sleep(1.5)  # the writer re-reads the config at most once a second


def native_windows():
    base = os.path.join(local_path, "framework", "native")
    if not os.path.isdir(base):
        return 0
    return sum(
        os.path.exists(os.path.join(base, node, w, "profile.pb.gz"))
        for node in os.listdir(base)
        for w in os.listdir(os.path.join(base, node))
    )


def own_fds_settled():
    """Waits (up to 5 s) until the sampler thread has closed the window folder it wrote."""
    native = re.sub(r"\d+", "N", os.path.join(local_path, "framework", "native"))  # as fds() writes it
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        if not any(t.startswith(native) for t in fds(local_path)):
            return
        time.sleep(0.01)


def write_manifest():
    with open(MANIFEST, "w") as f:
        json.dump(manifest, f)


def rss_kb():
    """Resident anonymous memory, kB (the heap; code paged in from files is left out). Not
    part of the state compared exactly: allocators keep some of what was freed."""
    with open("/proc/self/status") as f:
        return int(next(line for line in f if line.startswith("RssAnon:")).split()[1])


def wait_sampler_idle():
    """Waits (up to 60 s) until the native sampler thread has done its one-time warm-up (its
    CPU time stops growing for 0.3 s): the symboliser's caches it fills are not a window's."""
    tids = [t for t in os.listdir("/proc/self/task") if "trainprof-nativ" in open("/proc/self/task/%s/comm" % t).read()]
    if not tids:
        return

    def cpu():
        with open("/proc/self/task/%s/stat" % tids[0]) as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return int(fields[11]) + int(fields[12])  # utime + stime

    deadline = time.monotonic() + 60
    last, since = cpu(), time.monotonic()
    while time.monotonic() < deadline and time.monotonic() - since < 0.3:
        time.sleep(0.05)
        now = cpu()
        if now != last:
            last, since = now, time.monotonic()


steps(5)  # warm-up: the adapter's first steps, torch's threads
wait_sampler_idle()
manifest["before"] = state(model, local_path)
manifest["rss_kb_before"] = rss_kb()
if PARAMS.get("exit_in") == "native":
    # A window that stays open; exit (atexit runs) a few sampled steps after it opened.
    configure("native", hook.step + 3, 10**6)
    for _ in range(500):
        step()
        if sigprof()["handler"] not in (0, 1):  # pprof's handler: the window is open
            steps(5)
            manifest["exited_in_window"] = sigprof()["handler"] not in (0, 1)
            write_manifest()
            sys.exit(0)
    sys.exit("the native window never opened")
before_times = []
steps(PARAMS.get("measure_steps", 0), before_times)
for rnd in range(PARAMS.get("rounds", 1)):
    for kind in KINDS:
        num = 3 if kind == "native" else 2
        configure(kind, hook.step + 3, num)
        seen = native_windows()
        inside = []
        for _ in range(num + 4):
            step()
            inside.append(hook_count(model))
        if kind == "native":
            # The sampler thread writes the window after it ended (symbolisation: seconds).
            deadline = time.monotonic() + 60
            while native_windows() == seen and time.monotonic() < deadline:
                time.sleep(0.05)
            own_fds_settled()
        manifest["windows"].append([kind, rnd, max(inside)])
        manifest["after"].append([kind, rnd, state(model, local_path)])
after_times = []
steps(PARAMS.get("measure_steps", 0), after_times)
if before_times:
    for name, times in (("before", before_times), ("after", after_times)):
        manifest["step_wall_ms_" + name] = statistics.median(t for t, _ in times) * 1000
        manifest["step_cpu_ms_" + name] = statistics.median(c for _, c in times) * 1000
manifest["native_windows"] = native_windows()
manifest["rss_kb_after"] = rss_kb()
hook.close()
write_manifest()
