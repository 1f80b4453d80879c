"""trainprof is a guest in the trainer (docs/trainer.md, "Signals"): what C runtimes and
libraries do with signals (tests/hook/c/signal_guest.c, driven by
tests/hook/scripts/signal_guest.py) works the same with the flight recorder on as without
trainprof. Every case runs the same script twice, with ``HangDetectionConfig`` and with no
config, and compares the exit status and what the script printed."""

import json
import signal
import subprocess

import pytest
from conftest import SCRIPTS

HANG = {"HangDetectionConfig": {"HangTimeoutS": 1}}
C_DIR = SCRIPTS.parent / "c"


@pytest.fixture(scope="module")
def guest_lib(tmp_path_factory):
    out = tmp_path_factory.mktemp("guest") / "libsignal_guest.so"
    subprocess.run(
        ["cc", "-shared", "-fPIC", "-O1", "-o", str(out), str(C_DIR / "signal_guest.c"), "-lrt", "-lpthread"],
        check=True,
    )
    return out


def printed(run):
    """The ``key value`` lines the script printed, as a dict."""
    return dict(line.split(" ", 1) for line in run.proc.stdout.splitlines() if " " in line)


def both(run_script, guest_lib, params, config=HANG, timeout=90):
    p = dict(params, lib=str(guest_lib))
    on = run_script("signal_guest.py", p, config=config, timeout=timeout)
    off = run_script("signal_guest.py", p, config=None, timeout=timeout)
    return on, off


def dumps(out):
    return sorted(p.parent for p in (out / "framework" / "hangs").glob("*/*/stall.json"))


def test_a_runtime_that_fixes_its_own_segfaults_keeps_working(run_script, guest_lib):
    """The runtime's handler sees the real fault (SEGV_ACCERR, not a raise()d SI_TKILL copy)
    and fixes it; nothing dies and no crash dump is written."""
    on, off = both(run_script, guest_lib, {"how": "runtime"})
    assert on.proc.returncode == off.proc.returncode == 0, on.proc.stderr
    assert printed(on) == printed(off)
    assert printed(on)["touched"] == "42" and printed(on)["fixed"] == "1"
    assert printed(on)["si_code"] == "2", "SEGV_ACCERR: the real fault"
    assert dumps(on.out) == []


def test_a_fault_the_runtime_gives_back_kills_with_a_dump(run_script, guest_lib):
    on, off = both(run_script, guest_lib, {"how": "runtime", "give_back": True})
    assert on.proc.returncode == off.proc.returncode == -signal.SIGSEGV, on.proc.stderr
    [d] = dumps(on.out)
    s = json.loads((d / "stall.json").read_text())
    assert (s["kind"], s["signal"], s["step"]) == ("fatal", "SIGSEGV", 10)


def test_the_trainers_own_faulthandler_still_reports_and_the_crash_is_dumped(run_script, guest_lib):
    on, off = both(run_script, guest_lib, {"how": "runtime", "faulthandler": True})
    assert on.proc.returncode == off.proc.returncode == -signal.SIGSEGV, on.proc.stderr
    for run in (on, off):
        assert "Fatal Python error: Segmentation fault" in run.proc.stderr, run.proc.stderr
    [d] = dumps(on.out)
    assert json.loads((d / "stall.json").read_text())["signal"] == "SIGSEGV"
    assert "in <module>" in (d / "python_stacks.txt").read_text()


def test_a_runtime_that_longjmps_out_of_its_handler_keeps_trapping(run_script, guest_lib):
    """``SA_NODEFER`` and ``siglongjmp``: nothing of trainprof's is left in the thread's mask,
    so every later fault reaches the runtime again."""
    on, off = both(run_script, guest_lib, {"how": "jumper"})
    assert on.proc.returncode == off.proc.returncode == 0, on.proc.stderr
    assert printed(on) == printed(off) and printed(on)["trapped"] == "3"
    assert dumps(on.out) == []


@pytest.mark.parametrize("how, sig", [("abort", signal.SIGABRT), ("kill_segv", signal.SIGSEGV)])
def test_a_sent_fatal_signal_kills_as_without_trainprof_with_a_dump(run_script, guest_lib, how, sig):
    on, off = both(run_script, guest_lib, {"how": how})
    assert on.proc.returncode == off.proc.returncode == -sig, on.proc.stderr
    [d] = dumps(on.out)
    assert json.loads((d / "stall.json").read_text())["signal"] == signal.Signals(sig).name


def test_an_ignored_fatal_signal_stays_ignored(run_script, guest_lib):
    on, off = both(run_script, guest_lib, {"how": "ignored_fpe"})
    assert on.proc.returncode == off.proc.returncode == 0, on.proc.stderr
    assert printed(on) == printed(off) and printed(on)["ignored"] == "SIGFPE"
    assert dumps(on.out) == []


def test_a_real_time_signal_a_c_library_uses_is_not_taken(run_script, guest_lib):
    on, off = both(run_script, guest_lib, {"how": "ticker"})
    assert on.proc.returncode == off.proc.returncode == 0, on.proc.stderr
    assert int(printed(on)["ticks"]) >= 50 and int(printed(off)["ticks"]) >= 50, (printed(on), printed(off))
    assert printed(on)["installed"] == printed(off)["installed"] == "1"
    assert dumps(on.out) == []


def test_handlers_installed_after_the_profiler_are_never_called_by_a_dump(run_script, guest_lib):
    on, off = both(run_script, guest_lib, {"how": "late_rt"})
    assert on.proc.returncode == off.proc.returncode == 0, on.proc.stderr
    assert len(dumps(on.out)) == 2, on.proc.stderr
    assert (printed(on)["first"], printed(on)["second"]) == (printed(off)["first"], printed(off)["second"]) == ("0", "0")


def test_a_one_shot_sigterm_handler_keeps_its_mask_and_the_second_signal_kills(run_script, guest_lib):
    on, off = both(run_script, guest_lib, {"how": "oneshot"})
    assert on.proc.returncode == off.proc.returncode == -signal.SIGTERM, (on.proc.stdout, on.proc.stderr)
    assert printed(on) == printed(off) == {"calls": "1", "mask": "1"}


def test_a_handler_put_back_by_a_library_chains_to_what_it_chained_to(run_script, guest_lib):
    """A library saves trainprof's SIGINT handler, installs its own for a while (wrapped
    meanwhile) and puts the saved one back: SIGINT reaches Python's handler again."""
    on, off = both(run_script, guest_lib, {"how": "borrow"}, config={"HangDetectionConfig": {"HangTimeoutS": 60}})
    assert on.proc.returncode == off.proc.returncode == 0, on.proc.stderr
    assert printed(on) == printed(off) == {"interrupted": "yes", "borrowed_calls": "0", "done": "yes"}


@pytest.mark.parametrize("config", [HANG, {}], ids=["hang-detection", "defaults"])
def test_a_signal_the_trainer_waits_for_reaches_its_sigwait(run_script, guest_lib, config):
    on, off = both(run_script, guest_lib, {"how": "sigwait"}, config=config)
    assert on.proc.returncode == off.proc.returncode == 5, (on.proc.stdout, on.proc.stderr)
    assert printed(on)["sigwait"] == printed(off)["sigwait"] == "got SIGTERM"
