"""What trainprof's crash handler costs a runtime that uses SIGSEGV in normal operation
(docs/trainer.md, "Signals"): a C runtime (tests/hook/c/signal_guest.c) protects a page and
writes to it N times, its own handler fixing each fault, in a trainer with the flight recorder
on (`HangDetectionConfig`: the hook's handler sits in front and calls the runtime's) and in the
same script without trainprof. Prints the median µs per fault of five rounds each, side by side,
and a `RESULT {json}` line for bench/run.py.

    cargo build --release -p trainprof-hook
    python3 bench/signal_fault_cost.py target/release/libtrainprof_hook.so [N]
    BENCH_FAULTS=N TRAINPROF_HOOK_LIB=… python3 bench/signal_fault_cost.py  # as bench/run.py runs it

Standard library and `cc` only."""

import json
import os
import pathlib
import statistics
import subprocess
import sys
import tempfile

ROOT = pathlib.Path(__file__).resolve().parent.parent
TRAINER = r"""
import ctypes, json, os, sys, time
lib = ctypes.CDLL(sys.argv[1])
n = int(sys.argv[2])
assert lib.runtime_install(0) == 0
import trainprof
prof = trainprof.Profiler(framework="pytorch")
out = []
for _ in range(5):
    t0 = time.perf_counter()
    lib.runtime_fault_loop(n)
    out.append((time.perf_counter() - t0) / n * 1e6)
prof.close()
print(json.dumps(out))
"""


def main():
    lib = sys.argv[1] if len(sys.argv) > 1 else os.environ.get("TRAINPROF_HOOK_LIB", "target/release/libtrainprof_hook.so")
    hook_lib = pathlib.Path(lib).resolve()
    n = int(sys.argv[2]) if len(sys.argv) > 2 else int(os.environ.get("BENCH_FAULTS", "200000"))
    with tempfile.TemporaryDirectory(prefix="trainprof-faults-") as tmp:
        tmp = pathlib.Path(tmp)
        guest = tmp / "libsignal_guest.so"
        subprocess.run(["cc", "-shared", "-fPIC", "-O2", "-o", str(guest), str(ROOT / "tests/hook/c/signal_guest.c")], check=True)
        script = tmp / "trainer.py"
        script.write_text(TRAINER)
        config = tmp / "profilerconfig.json"
        config.write_text(json.dumps({"ProfilingParameters": {"LocalPath": str(tmp / "out"), "HangDetectionConfig": json.dumps({"HangTimeoutS": 300})}}))
        results = {}
        for side, cfg in (("without trainprof", tmp / "none.json"), ("trainprof, flight recorder on", config)):
            env = dict(os.environ, PYTHONPATH=str(ROOT / "hook-ffi" / "python"), TRAINPROF_HOOK_LIB=str(hook_lib), SMPROFILER_CONFIG_PATH=str(cfg), TRAINPROF_RESOURCE_CONFIG=str(tmp / "none.json"))
            p = subprocess.run([sys.executable, str(script), str(guest), str(n)], env=env, capture_output=True, text=True, timeout=600)
            if p.returncode != 0:
                sys.exit("%s failed (%d): %s" % (side, p.returncode, p.stderr))
            results[side] = json.loads(p.stdout.strip().splitlines()[-1])
        print("| side | µs per fault, median of 5 rounds of %d (min–max) |" % n)
        print("|---|---|")
        for side, xs in results.items():
            print("| %s | %.2f (%.2f–%.2f) |" % (side, statistics.median(xs), min(xs), max(xs)))
        mine, plain = (statistics.median(results[k]) for k in ("trainprof, flight recorder on", "without trainprof"))
        print("RESULT " + json.dumps({"metric": "a runtime's own SIGSEGV fixed, per fault (%d faults, flight recorder on)" % n,
                                      "unit": "µs", "trainprof": round(mine, 3), "peer": round(plain, 3),
                                      "peer_name": "the same script without trainprof", "better": "lower"}))


if __name__ == "__main__":
    main()
