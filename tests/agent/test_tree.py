"""The trainer tree as `trainprof run` reports it (docs/formats.md, "The trainer tree"),
against what the processes themselves measure: PSS that counts shared pages once, the
CPU of short-lived children that exit between ticks, and the busiest processes by name.
Read back with smdebug 1.0.34's LocalSystemMetricsReader."""

import json
import shutil
import subprocess

import pytest
from tree_support import by_tick, python, run_agent

MIB = 1 << 20

# A parent maps a shared anonymous region and touches it, forks 8 children that touch it
# too and wait; meanwhile the parent sums the tree's Pss and Rss from smaps_rollup itself.
SHARED = r"""
import json, mmap, os, sys, time
N, SIZE = 8, 64 << 20
m = mmap.mmap(-1, SIZE)  # MAP_SHARED | MAP_ANONYMOUS
for i in range(0, SIZE, 4096):
    m[i] = 1
kids = []
for _ in range(N):
    pid = os.fork()
    if pid == 0:
        s = 0
        for i in range(0, SIZE, 4096):
            s += m[i]
        time.sleep(9)
        os._exit(0)
    kids.append(pid)
# PSS is re-read in passes at least 5 s apart (docs/formats.md, "The trainer tree"): after
# 7 s every process has been read since the children touched the region.
time.sleep(7)
def field(pid, key):
    with open(f"/proc/{pid}/smaps_rollup") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
own = [os.getpid()] + kids
print(json.dumps({"pss": sum(field(p, "Pss") for p in own), "rss": sum(field(p, "Rss") for p in own)}))
sys.stdout.flush()
for p in kids:
    os.waitpid(p, 0)
"""


def test_pss_counts_shared_pages_once(trainprof_bin, tmp_path):
    proc, events = run_agent(trainprof_bin, tmp_path, python(SHARED))
    assert proc.returncode == 0, proc.stderr
    own = json.loads(proc.stdout.strip().splitlines()[-1])
    ticks = by_tick(events, "trainer")
    full = [t for t in ticks.values() if t.get(("Processes", "ProcessTree")) == 9]
    assert len(full) >= 10, (len(full), proc.stderr)
    # The last ticks with the whole tree: every process has had its PSS read by then.
    last = full[-3]
    pss, rss = last[("PSSBytes", "ProcessTree")], last[("RSSBytes", "ProcessTree")]
    # Summed RSS counts the 64 MiB nine times; PSS once (plus each interpreter's own).
    print(f"PSS {pss / MIB:.0f} MiB, summed RSS {rss / MIB:.0f} MiB; the processes: {own}")
    assert rss >= 9 * 64 * MIB, (pss, rss)
    assert 64 * MIB <= pss <= 0.4 * rss, (pss, rss)
    # And it agrees with what the processes' own smaps_rollup said.
    assert pss == pytest.approx(own["pss"], rel=0.15), (pss, own)
    assert rss == pytest.approx(own["rss"], rel=0.15), (rss, own)
    # Per-process rows: at most five a tick, named pid<pid>-<comm>.
    for t in full:
        top = [name for (name, dim) in t if dim == "ProcessCPUPercent"]
        assert 1 <= len(top) <= 5, t
        assert all(name.startswith("pid") and "-python" in name for name in top), top
        assert all((name, "ProcessPSSBytes") in t for name in top), t


BURNER_C = r"""
#include <time.h>
/* Burns argv-free 50 ms of its own CPU time, then exits. */
int main(void) {
    struct timespec t;
    volatile unsigned long x = 0;
    do {
        for (int i = 0; i < 10000; i++) x += i;
        clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
    } while (t.tv_sec == 0 && t.tv_nsec < 50000000L);
    return 0;
}
"""

# 60 burners one after the other, each living ~50 ms (under one 100 ms tick apart from the
# next); the parent reports the CPU its reaped children used (os.times) and its own.
BURNERS = r"""
import json, os, subprocess, sys
for _ in range(60):
    subprocess.run([sys.argv[1]], check=True)
t = os.times()
print(json.dumps({"children": t.children_user + t.children_system, "own": t.user + t.system}))
"""


def test_short_lived_children_are_counted(trainprof_bin, tmp_path):
    cc = shutil.which("cc")
    if cc is None:
        pytest.fail("no C compiler (cc) on PATH")
    burner = tmp_path / "burn50ms"
    src = tmp_path / "burn.c"
    src.write_text(BURNER_C)
    subprocess.run([cc, "-O1", "-o", str(burner), str(src)], check=True)
    proc, events = run_agent(trainprof_bin, tmp_path, python(BURNERS) + [str(burner)])
    assert proc.returncode == 0, proc.stderr
    used = json.loads(proc.stdout.strip().splitlines()[-1])
    assert used["children"] >= 60 * 0.05 * 0.95, used
    ticks = by_tick(events, "trainer")
    stamps = list(ticks)
    cpu_s = 0.0
    for prev, cur in zip(stamps, stamps[1:]):
        cpu_s += ticks[cur].get(("CPUPercent", "ProcessTree"), 0.0) / 100 * (cur - prev)
    # The burners' CPU reaches the tree through the parent's cutime/cstime as each is
    # reaped: the integral of CPUPercent covers it (the parent's own time too, so at most
    # the sum of both, with a tick's rounding).
    total = used["children"] + used["own"]
    print(f"tree CPU {cpu_s:.2f} s; the burners {used['children']:.2f} s, the parent {used['own']:.2f} s")
    assert cpu_s >= 0.9 * used["children"], (cpu_s, used)
    assert cpu_s <= 1.1 * total + 0.1, (cpu_s, used)


# A fork storm: the parent fills 300 MiB of its own (private) memory, forks 20 children
# that share it copy-on-write and wait, and sums the tree's Pss from smaps_rollup itself
# three times while they live. Each child's RSS is 300 MiB; the tree's PSS stays ~310 MiB.
# The children live until 2 s after the parent's last read (they wait for the end of a pipe
# the parent closes then, or that closes when it dies), not for a fixed time: on a loaded
# machine the forks and reads can outlast any such time (docs/testing.md, "Waiting in tests").
FORK_STORM = r"""
import json, os, sys, time
N, SIZE = 20, 300 << 20
buf = bytearray(b"\x01") * SIZE
time.sleep(1)
done_r, done_w = os.pipe()
kids = []
for _ in range(N):
    pid = os.fork()
    if pid == 0:
        os.close(done_w)
        os.read(done_r, 1)  # returns at end of file: the parent has read every process
        os._exit(0)
    kids.append(pid)
def pss(pid):
    with open(f"/proc/{pid}/smaps_rollup") as f:
        for line in f:
            if line.startswith("Pss:"):
                return int(line.split()[1]) * 1024
truth = []
for _ in range(3):
    time.sleep(2)
    truth.append(sum(pss(p) for p in [os.getpid()] + kids))
time.sleep(2)  # the children outlive the last read by 2 s, as the agent's last ticks need
os.close(done_w)
# They exit now, and stay zombies for 2 s: the parent holds every page alone.
time.sleep(2)
def state(pid):
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()[0]
zombies = sum(state(p) == "Z" for p in kids)
print(json.dumps({"pss": truth, "zombies": zombies, "alone": pss(os.getpid())}))
sys.stdout.flush()
for p in kids:
    os.waitpid(p, 0)
"""


def test_pss_after_a_fork_storm_never_overcounts(trainprof_bin, tmp_path):
    """A child whose PSS is not read yet (reads are paced: 300 MiB takes a few ms each) must
    not stand in with its RSS, nor the parent's PSS read before the forks count whole; and
    once the children exit, as zombies not yet reaped, their last PSS must not count the
    pages their parent now holds alone."""
    proc, events = run_agent(trainprof_bin, tmp_path, python(FORK_STORM))
    assert proc.returncode == 0, proc.stderr
    said = json.loads(proc.stdout.strip().splitlines()[-1])
    truth = said["pss"]
    assert all(250 * MIB <= t <= 400 * MIB for t in truth), truth
    assert said["zombies"] == 20, said
    # The last full ticks are the zombies' (2 s of them): the parent alone holds it all.
    truth.append(said["alone"])
    ticks = by_tick(events, "trainer")
    full = [t for t in ticks.values() if t.get(("Processes", "ProcessTree")) == 21]
    assert len(full) >= 30, (len(full), proc.stderr)
    seen = [t[("PSSBytes", "ProcessTree")] for t in full]
    print(f"PSS over {len(seen)} ticks: {min(seen) / MIB:.0f}..{max(seen) / MIB:.0f} MiB; the processes: "
          f"{[round(t / MIB) for t in truth]} MiB")
    # Every tick: within 1.5x of what the processes' own smaps_rollup said.
    assert max(seen) <= 1.5 * max(truth), (max(seen), truth)
    # And once every process has been read, close to it.
    assert seen[-3] == pytest.approx(truth[-1], rel=0.3), (seen[-3], truth)
