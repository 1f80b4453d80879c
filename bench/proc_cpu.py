"""What the benchmarks that measure a process from outside share: its CPU time from /proc.
Imported from the benchmarks' own folder, which Python puts first on sys.path (standard
library only: bench/gpu_check.py runs on a GPU machine with nothing but the repo's files)."""

import glob


def cpu_ns(pid):
    """The process's CPU time: the sum over its threads of schedstat's run time, ns."""
    total = 0
    for path in glob.glob("/proc/%d/task/*/schedstat" % pid):
        try:
            with open(path) as f:
                total += int(f.read().split()[0])
        except (OSError, ValueError, IndexError):
            pass
    return total
