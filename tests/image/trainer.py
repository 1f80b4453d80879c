"""The example trainer (examples/train.py) as a container runs it for scripts/test-image.

It runs train.main() unchanged, and adds what the image checks need to see:

* on SIGTERM it prints its last words (``trainer: SIGTERM, last words``) and exits with
  TERM_STATUS (default 43), so the container's exit status shows whose status it is;
* after a full run it exits with EXIT_STATUS (default: train.main()'s).

examples/ is found beside this file's folder (``/job/examples`` in the container, where
scripts/test-image mounts both) or in a checkout.
"""

import os
import signal
import sys

here = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(here, "..", "examples"))
sys.path.insert(0, os.path.join(here, "..", "..", "examples"))
import train  # noqa: E402


def on_term(signum, frame):
    print("trainer: SIGTERM, last words", flush=True)
    # SystemExit unwinds train.main(): the profiler's `with` block closes and seals.
    sys.exit(int(os.environ.get("TERM_STATUS", "43")))


def main():
    signal.signal(signal.SIGTERM, on_term)
    print("trainer: pid %d uid %d started" % (os.getpid(), os.getuid()), flush=True)
    rc = train.main()
    status = os.environ.get("EXIT_STATUS")
    return int(status) if status is not None else rc


if __name__ == "__main__":
    sys.exit(main())
