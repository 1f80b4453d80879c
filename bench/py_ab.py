"""Benchmark (not a test): the Python package's per-event and per-step cost, this tree's
package against another commit's, side by side in one run, on the same library.

    cargo build --release -q -p trainprof-hook
    TRAINPROF_HOOK_LIB=$PWD/target/release/libtrainprof_hook.so \\
        .venv/bin/python bench/py_ab.py [REF] [ROUNDS]   # default: ae6b779, $BENCH_ROUNDS or 5

``scripts/bench --only py-ab`` runs it too (ae6b779: the package before its fast paths).
REF's ``hook-ffi/python`` is extracted (git archive) into a temporary folder; both packages
load the same library (the C ABI is the contract), so only the Python code differs. Each round runs one fresh process per package (which goes first
alternates), each measuring, in batches of 100 with time.perf_counter_ns:

  * ``with prof.record("Forward", "Net"): pass``           ns per event
  * ``prof.record_event("Forward", "Net", t0, t1, step=i // 1000)``  ns per event
    (what scripts/bench-hook-python times)
  * ``trainprof.torch`` outside every window: the forward pre-hook and forward hook of an
    attached top module, as a module call runs them (a stand-in module with torch's
    ``register_forward_pre_hook`` / ``register_forward_hook``; torch itself is not needed),
    µs per step

The config is step_vs_smdebug.py's: every window configured at step 1e9, so all stay closed
(the steady state between profiling windows). The table: the median over rounds of each
round's p50 and p99.
"""

import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

from closed_windows import FAR, pct, write_config  # noqa: E402,F401  (bench/)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BATCH = 100
N_EVENTS = int(os.environ.get("BENCH_EVENTS", "100000"))
N_STEPS = int(os.environ.get("BENCH_STEPS", "20000"))


# --- the worker: one package, one process -------------------------------------------------


class FakeModule:
    """What trainprof.torch needs of a torch.nn.Module, and a call that runs its hooks in
    torch's order (pre-hooks; forward; forward hooks)."""

    training = True

    def __init__(self):
        self._pre = []
        self._post = []

    def register_forward_pre_hook(self, fn):
        self._pre.append(fn)
        return _Handle(self._pre, fn)

    def register_forward_hook(self, fn):
        self._post.append(fn)
        return _Handle(self._post, fn)

    def named_modules(self):
        return [("", self)]

    def __call__(self, x):
        for h in self._pre:
            h(self, (x,))
        out = x
        for h in self._post:
            h(self, (x,), out)
        return out


class _Handle:
    def __init__(self, hooks, fn):
        self._hooks, self._fn = hooks, fn

    def remove(self):
        if self._fn in self._hooks:
            self._hooks.remove(self._fn)


def worker():
    import trainprof
    import trainprof.torch

    clock = time.perf_counter_ns
    prof = trainprof.Profiler(framework="pytorch")
    if not prof.enabled:
        raise SystemExit("the profiler is not enabled (init status %s)" % prof.init_status)
    prof.step_begin("train")
    out = {}

    def span():
        rec = prof.record
        for _ in range(200):
            with rec("Forward", "Net"):
                pass
        per = []
        for _ in range(N_EVENTS // BATCH):
            t0 = clock()
            for _ in range(BATCH):
                with rec("Forward", "Net"):
                    pass
            per.append((clock() - t0) / BATCH)
        return per

    def record_event():
        rec = prof.record_event
        start = prof.now_us()
        per = []
        for b in range(N_EVENTS // BATCH):
            t0 = clock()
            for i in range(BATCH):
                rec("Forward", "Net", start + i, start + i + 1, step=b // 10)
            per.append((clock() - t0) / BATCH)
        return per

    out["span"] = span()
    time.sleep(0.2)  # let the writer drain: the queue-full drop path is cheaper
    out["record_event"] = record_event()
    prof.step_end()
    time.sleep(0.2)

    model = FakeModule()
    hook = trainprof.torch.attach(model, profiler=prof)
    for _ in range(200):
        model(0)
    per = []
    for _ in range(N_STEPS // BATCH):
        t0 = clock()
        for _ in range(BATCH):
            model(0)
        per.append((clock() - t0) / BATCH / 1000.0)
    # the stand-in module's own call, without hooks, to subtract
    bare = FakeModule()
    base = []
    for _ in range(N_STEPS // BATCH):
        t0 = clock()
        for _ in range(BATCH):
            bare(0)
        base.append((clock() - t0) / BATCH / 1000.0)
    b50 = pct(base, 0.5)
    out["torch_step"] = [v - b50 for v in per]
    out["torch_steps"] = hook.step + 1
    hook.close()
    out["dropped"] = prof.dropped
    prof.close()
    print("WORKER " + json.dumps({k: v if not isinstance(v, list) else [pct(v, 0.5), pct(v, 0.99)] for k, v in out.items()}))


# --- the driver -----------------------------------------------------------------------------


def extract(ref, into):
    os.makedirs(into, exist_ok=True)
    tar = subprocess.run(["git", "-C", ROOT, "archive", ref, "hook-ffi/python"], check=True, capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", into], input=tar, check=True)
    return os.path.join(into, "hook-ffi", "python")


def run_one(pkg_dir, tmp, name):
    env = dict(os.environ)
    for k in list(env):
        if k.startswith("TRAINPROF_") and k != "TRAINPROF_HOOK_LIB":
            del env[k]
    env["PYTHONPATH"] = pkg_dir
    env["SMPROFILER_CONFIG_PATH"] = write_config(tmp, name)[0]
    p = subprocess.run([sys.executable, os.path.abspath(__file__), "--worker"], env=env, capture_output=True, text=True)
    for line in p.stdout.splitlines():
        if line.startswith("WORKER "):
            return json.loads(line[7:])
    raise SystemExit("worker failed (%s):\n%s\n%s" % (name, p.stdout, p.stderr))


def main():
    ref = sys.argv[1] if len(sys.argv) > 1 else "ae6b779"
    rounds = int(sys.argv[2]) if len(sys.argv) > 2 else int(os.environ.get("BENCH_ROUNDS", "5"))
    if "TRAINPROF_HOOK_LIB" not in os.environ:
        os.environ["TRAINPROF_HOOK_LIB"] = os.path.join(ROOT, "target", "release", "libtrainprof_hook.so")
    tmp = tempfile.mkdtemp(prefix="trainprof-pyab-")
    try:
        sides = {"before": extract(ref, os.path.join(tmp, "old")), "after": os.path.join(ROOT, "hook-ffi", "python")}
        got = {k: [] for k in sides}
        for r in range(rounds):
            order = ("before", "after") if r % 2 == 0 else ("after", "before")
            for side in order:
                got[side].append(run_one(sides[side], tmp, "%s-%d" % (side, r)))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    rows = [
        ("span", "with prof.record(...) from Python", "ns/event", 1),
        ("record_event", "prof.record_event(...) from Python", "ns/event", 1),
        ("torch_step", "trainprof.torch per step, windows closed", "µs/step", 2),
    ]
    print("library %s; %d rounds, one process per package per round, order alternating" % (os.environ["TRAINPROF_HOOK_LIB"], rounds))
    print("%-46s %-8s %-10s %12s %12s %8s" % ("metric", "q", "unit", "before " + ref, "after", "after/before"))
    for key, title, unit, nd in rows:
        for qi, q in ((0, "p50"), (1, "p99")):
            b = statistics.median(w[key][qi] for w in got["before"])
            a = statistics.median(w[key][qi] for w in got["after"])
            print("%-46s %-8s %-10s %12.*f %12.*f %8.2f" % (title, q, unit, nd, b, nd, a, a / b if b else float("nan")))
            print("RESULT " + json.dumps({"metric": "%s, %s" % (title, q), "unit": unit, "trainprof": round(a, nd),
                                          "peer": round(b, nd), "peer_name": "trainprof package at %s" % ref,
                                          "better": "lower"}, ensure_ascii=False))
    for side in sides:
        print("p50 per round, %-7s span %s | torch step %s" % (
            side, " ".join("%.0f" % w["span"][0] for w in got[side]),
            " ".join("%.2f" % w["torch_step"][0] for w in got[side])))
    print("steps counted by the adapter, dropped events (last round): before %d, %d; after %d, %d" % (
        got["before"][-1]["torch_steps"], got["before"][-1]["dropped"], got["after"][-1]["torch_steps"], got["after"][-1]["dropped"]))
    return 0


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        sys.exit(worker())
    sys.exit(main())
