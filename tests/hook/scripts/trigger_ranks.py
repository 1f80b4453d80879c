"""A rank of a toy job for tests/hook/test_trigger.py (`trainprof trigger`): steps of
``step_ms`` until the file ``stop`` appears (bounded by ``max_steps``), one Compute event a
step (not `Forward`: that phase marks a detailed window's module events, docs/formats.md). ``launch`` starts one process per rank (``RANK`` set) and waits for them all.

With ``stuck_rank`` equal to this rank, after step 5 it waits outside a step (between
``step_end`` and the next ``step_begin``) until the file ``release`` appears: its trainer
loop never reaches a step boundary meanwhile, as a rank stuck in data loading or a
checkpoint.

With ``signals_to``, each rank writes ``<signals_to>.<rank>``: its signal dispositions as the
kernel has them (/proc/self/status's ``SigCgt`` and ``SigIgn``, and the main thread's
``SigBlk``) after its first step and again before it closes the profiler.

TRAINPROF_TEST_PARAMS: ``{"stop": path, "release": path, "step_ms": float, "max_steps": int,
"stuck_rank": int, "ranks": int, "signals_to": path, "own_rt": bool}``.

With ``own_rt`` each rank installs its own Python handler on ``SIGRTMAX - 4`` (the first
real-time signal trainprof would borrow) before its first step; the file of ``signals_to``
then also says whether that handler is still installed at the end and runs when raised."""

import json
import os
import subprocess
import sys
import time

import waits

PARAMS = json.loads(os.environ.get("TRAINPROF_TEST_PARAMS") or "{}")

if "RANK" not in os.environ:
    procs = []
    for rank in range(int(PARAMS.get("ranks", 2))):
        env = dict(os.environ, RANK=str(rank))
        procs.append(subprocess.Popen([sys.executable, os.path.abspath(__file__)], env=env))
    sys.exit(max(p.wait() for p in procs))

import trainprof  # noqa: E402

RANK = int(os.environ["RANK"])
SIGNALS = {}


def note_signals(when):
    with open("/proc/self/status") as f:
        SIGNALS[when] = {k: v.strip() for k, v in (line.split(":", 1) for line in f)
                         if k in ("SigCgt", "SigIgn", "SigBlk")}


STEP_S = float(PARAMS.get("step_ms", 20)) / 1000.0
OWN_RT_RAN = []
if PARAMS.get("own_rt"):
    import signal

    OWN_RT = signal.SIGRTMAX - 4
    signal.signal(OWN_RT, lambda signum, frame: OWN_RT_RAN.append(signum))
prof = trainprof.Profiler(framework="pytorch")
for step in range(int(PARAMS.get("max_steps", 6000))):
    if os.path.exists(PARAMS["stop"]):
        break
    prof.step_begin("train")
    if prof.active("detailed"):
        # What a framework adapter would profile in this step: the test reads these back.
        with prof.record("TestDetailed", "detailed"):
            pass
    with prof.record("Compute", "Net"):
        time.sleep(STEP_S)
    prof.step_end()
    if step == 0:
        note_signals("start")
    if step == 5 and PARAMS.get("stuck_rank") == RANK:
        open(PARAMS["release"] + ".waiting", "w").close()
        waits.wait_for(lambda: os.path.exists(PARAMS["release"]), bound_s=120)
note_signals("end")
if PARAMS.get("own_rt"):
    SIGNALS["own_rt_installed"] = signal.getsignal(OWN_RT) is not signal.SIG_DFL and callable(signal.getsignal(OWN_RT))
    signal.raise_signal(OWN_RT)
    SIGNALS["own_rt_ran"] = OWN_RT_RAN == [OWN_RT]
if PARAMS.get("signals_to"):
    with open("%s.%d" % (PARAMS["signals_to"], RANK), "w") as f:
        json.dump(SIGNALS, f)
prof.close()
print("rank %d done" % RANK, flush=True)
