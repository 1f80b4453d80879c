"""One-line warnings on stderr, each distinct one printed once per process."""

import sys
import threading

_seen = set()
_lock = threading.Lock()


def warn(message, key=None):
    """Prints ``trainprof: <message>`` to stderr unless a warning with the same ``key``
    (default: the message) was printed already. Never raises."""
    try:
        k = message if key is None else key
        with _lock:
            if k in _seen:
                return
            _seen.add(k)
        sys.stderr.write("trainprof: %s\n" % (message,))
        sys.stderr.flush()
    except Exception:  # stderr closed or broken: nothing better to do
        pass
