"""What closing a detailed window costs the trainer, against plain ``torch.profiler`` on
the same steps (docs/trainer.md, "Framework adapters: `trainprof.torch` and
`trainprof.keras`"): the opt-in torch tier's benchmark, run with the torch venv
(``scripts/test-frameworks torch`` makes it):

    .venv-torch/bin/python bench/detailed_close.py     # BENCH_ROUNDS=3 BENCH_WINDOW=5

One process per run, each round running every kind in turn on the same CPU model (a stack
of small layers: hundreds of ops a step, the case where a profiler's buffers grow):

  none        no profiler: the steady step and the baseline peak RSS
  plain       ``torch.profiler.profile(activities=[CPU])`` started before step S, stopped
              before step S + W, then ``export_chrome_trace`` (what a user of plain
              torch.profiler does to keep the events)
  trainprof   ``trainprof.torch.attach`` with ``DetailedProfilingConfig`` {S, W}: torch.profiler
              run by the adapter, its events written into trainprof's timeline

Per run: the close (the extra wall time of the step that closes the window, over the run's
median steady step), the peak RSS (``ru_maxrss``) and the RSS just before the window opens
(so that the window's own growth can be told from trainprof's fixed footprint: the library,
its threads and its event queue, there with or without a window). The figures: trainprof's close and
peak RSS growth (over ``none``) against plain's; the goal is at most 10 % beyond the
profiler's. ``BENCH_PYTHON_CONVERSION=1`` measures the adapter's fallback instead (torch's
results read in Python, one library call an event: what every window did before the
library read torch's own trace). Uses the release library (target/release/libtrainprof_hook.so, or
TRAINPROF_HOOK_LIB). Prints RESULT lines (bench/run.py's format).
"""

import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ROUNDS = int(os.environ.get("BENCH_ROUNDS", "3"))
START = int(os.environ.get("BENCH_START", "10"))
WINDOW = int(os.environ.get("BENCH_WINDOW", "5"))
AFTER = 10
LAYERS = int(os.environ.get("BENCH_LAYERS", "60"))
LIB = os.environ.get("TRAINPROF_HOOK_LIB") or os.path.join(ROOT, "target", "release", "libtrainprof_hook.so")


def child(kind, out_dir):
    import torch
    from torch import nn

    torch.manual_seed(0)
    torch.set_num_threads(1)
    layers = []
    for _ in range(LAYERS):
        layers += [nn.Linear(64, 64), nn.ReLU()]
    model = nn.Sequential(*layers)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = torch.randn(32, 64), torch.randn(32, 64)
    hook = None
    if kind == "trainprof":
        import trainprof.torch

        if os.environ.get("BENCH_PYTHON_CONVERSION") == "1":
            # The adapter's fallback (the events read in Python), for a before/after figure.
            trainprof.torch.TorchHook._hand_over_trace = lambda *a: False
        hook = trainprof.torch.attach(model)
    tp = None
    times = []
    rss_before_window = 0.0
    for step in range(START + WINDOW + AFTER):
        if step == START:
            rss_before_window = _rss_mib()
        t0 = time.perf_counter()
        if kind == "plain" and step == START:
            from torch.profiler import ProfilerActivity, profile

            tp = profile(activities=[ProfilerActivity.CPU])
            tp.start()
        if kind == "plain" and step == START + WINDOW:
            tp.stop()
            tp.export_chrome_trace(os.path.join(out_dir, "trace.json"))
            tp = None
        opt.zero_grad()
        loss = ((model(x) - y) ** 2).mean()
        loss.backward()
        opt.step()
        times.append(time.perf_counter() - t0)
    events = 0
    if hook is not None:
        hook.close()
        events = hook.profiler.stats().get("events_written", 0) if hasattr(hook.profiler, "stats") else 0
    steady = statistics.median(times[:START] + times[START + WINDOW + 1:])
    print(json.dumps({
        "steady_ms": steady * 1e3,
        "close_ms": (times[START + WINDOW] - steady) * 1e3,
        "window_ms": statistics.median(times[START:START + WINDOW]) * 1e3,
        "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0,
        "rss_before_window_mib": rss_before_window,
        "events": events,
    }))


def _rss_mib():
    """The resident memory now (``/proc/self/statm``), MiB."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 1048576.0


def run(kind, work):
    out = os.path.join(work, kind)
    os.makedirs(out, exist_ok=True)
    cfg = os.path.join(work, "cfg.json")
    with open(cfg, "w") as f:
        json.dump({"ProfilingParameters": {"LocalPath": out, "DetailedProfilingConfig": json.dumps(
            {"StartStep": START, "NumSteps": WINDOW})}}, f)
    env = dict(os.environ, PYTHONPATH=os.path.join(ROOT, "hook-ffi", "python"), TRAINPROF_HOOK_LIB=LIB,
               SMPROFILER_CONFIG_PATH=cfg, TRAINPROF_RESOURCE_CONFIG=os.path.join(work, "none.json"))
    p = subprocess.run([sys.executable, __file__, "--child", kind, out], env=env, capture_output=True, text=True,
                       timeout=600)
    if p.returncode != 0:
        sys.exit("%s failed:\n%s" % (kind, p.stderr))
    return json.loads(p.stdout.strip().splitlines()[-1])


def torch_python():
    """This interpreter when it has torch, else the torch venv's (``.venv-torch``), else None."""
    try:
        import torch  # noqa: F401

        return sys.executable
    except ImportError:
        venv = os.path.join(ROOT, ".venv-torch", "bin", "python")
        return venv if os.path.isfile(venv) else None


def main():
    if len(sys.argv) == 4 and sys.argv[1] == "--child":
        return child(sys.argv[2], sys.argv[3])
    py = torch_python()
    if py is None:
        print("skipped: no torch here and no .venv-torch (scripts/test-frameworks torch makes it)")
        return None
    if py != sys.executable:
        os.execv(py, [py, os.path.abspath(__file__)])
    if not os.path.isfile(LIB):
        sys.exit("%s is missing: cargo build --release -p trainprof-hook" % LIB)
    work = tempfile.mkdtemp(prefix="detailed-close-")
    got = {"none": [], "plain": [], "trainprof": []}
    for r in range(ROUNDS):
        for kind in got:
            m = run(kind, work)
            got[kind].append(m)
            print("  round %d %-9s steady %.2f ms, window step %.2f ms, close %+.1f ms, peak RSS %.1f MiB"
                  " (%.1f MiB before the window)"
                  % (r, kind, m["steady_ms"], m["window_ms"], m["close_ms"], m["peak_rss_mib"],
                     m["rss_before_window_mib"]))
    med = {k: {f: statistics.median(m[f] for m in v) for f in v[0]} for k, v in got.items()}
    base_rss = med["none"]["peak_rss_mib"]
    for what, unit, tp, plain in (
        ("close of a %d-step detailed window (extra wall time of the closing step)" % WINDOW, "ms",
         med["trainprof"]["close_ms"], med["plain"]["close_ms"]),
        ("peak RSS growth over no profiler, %d-step detailed window" % WINDOW, "MiB",
         med["trainprof"]["peak_rss_mib"] - base_rss, med["plain"]["peak_rss_mib"] - base_rss),
        ("peak RSS growth over the RSS just before the window opened (the window's own), %d-step detailed window"
         % WINDOW, "MiB", med["trainprof"]["peak_rss_mib"] - med["trainprof"]["rss_before_window_mib"],
         med["plain"]["peak_rss_mib"] - med["plain"]["rss_before_window_mib"]),
        ("step time inside the window", "ms", med["trainprof"]["window_ms"], med["plain"]["window_ms"]),
    ):
        print("RESULT " + json.dumps({"metric": "%s (p50 of %d rounds, %d layers)" % (what, ROUNDS, LAYERS),
                                      "unit": unit, "trainprof": round(tp, 2), "peer": round(plain, 2),
                                      "peer_name": "plain torch.profiler + export_chrome_trace",
                                      "better": "lower"}))


if __name__ == "__main__":
    main()
