"""`trainprof report` of two builds side by side, in one run (BENCHMARKS.md):

    python3 bench/report_ab.py OLD_BIN NEW_BIN JOB_DIR [JOB_DIR ...] [--rounds 2]

For each job, `report DIR --json` and `report DIR -o page.html`, old and new alternately, each a
forked child (wall time from the parent; CPU time and peak RSS from its `wait4` rusage); the
page goes to a new file each time (the report never replaces one). Prints one markdown row per
job, output and side: wall s and CPU s of each round, the peak RSS, the output's size."""

import argparse
import os
import shutil
import tempfile
import time


def run(argv, stdout):
    t = time.monotonic()
    pid = os.fork()
    if pid == 0:
        os.dup2(os.open(os.devnull, os.O_WRONLY), 2)
        os.dup2(os.open(stdout, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), 1)
        os.execv(argv[0], argv)
    _, status, ru = os.wait4(pid, 0)
    if status != 0:
        raise SystemExit("%s exited with status %d" % (" ".join(argv), status))
    return time.monotonic() - t, ru.ru_utime + ru.ru_stime, ru.ru_maxrss / 1024


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("old")
    ap.add_argument("new")
    ap.add_argument("jobs", nargs="+")
    ap.add_argument("--rounds", type=int, default=2)
    a = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="report-ab-")
    out, page = os.path.join(tmp, "stdout"), os.path.join(tmp, "page.html")
    print("| job | output | side | wall s | CPU s | peak RSS MiB | size, bytes |\n|---|---|---|---|---|---|---|")
    try:
        for job in a.jobs:
            for what, extra in (("`--json`", ["--json"]), ("page", ["-o", page])):
                res = {"old": [], "new": []}
                for _ in range(a.rounds):
                    for side in ("old", "new"):
                        if os.path.exists(page):
                            os.unlink(page)
                        wall, cpu, rss = run([getattr(a, side), "report", job] + extra, out)
                        res[side].append((wall, cpu, rss, os.path.getsize(out if what != "page" else page)))
                for side in ("old", "new"):
                    v = res[side]
                    print("| %s | %s | %s | %s | %s | %.1f | %s |" % (
                        os.path.basename(os.path.normpath(job)), what, side,
                        " / ".join("%.2f" % x[0] for x in v), " / ".join("%.2f" % x[1] for x in v),
                        max(x[2] for x in v), "{:,}".format(v[-1][3])), flush=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
