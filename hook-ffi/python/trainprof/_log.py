"""How the package tells the user something: ``warnings`` for what the user should fix and
see once, the ``trainprof`` logger for the rest (docs/python.md, "Messages").

* :func:`warn_user` issues a :class:`TrainprofWarning` (``warnings.warn``): a setup the user
  can fix (no loadable hook library, pyinstrument missing, ``step_end()`` without
  ``step_begin()``). Python's filters show each once per place and let a user silence it
  (``-W ignore::trainprof.TrainprofWarning``); a filter that turns it into an error is
  logged instead, because profiling never raises into the training loop.
* :func:`log` writes to the ``trainprof`` logger, at most once per ``key`` per process (a
  status that repeats on every event is said once). The logger has a handler of its own
  that writes ``trainprof: <message>`` lines to stderr, and does not propagate: the
  package's lines look the same whether or not the trainer configured logging (TensorFlow,
  for one, installs a root handler). To route them elsewhere, replace that handler and set
  ``propagate`` (``logging.getLogger("trainprof")``); to silence them, raise its level.
"""

from __future__ import annotations

import logging
import sys
import threading
import warnings
from typing import Hashable, Optional

__all__ = ["TrainprofWarning", "logger", "log", "warn_user"]

#: The package's logger.
logger = logging.getLogger("trainprof")


class TrainprofWarning(UserWarning):
    """A profiling setup the user can fix; profiling goes on without the feature concerned."""


class _StderrHandler(logging.Handler):
    """Writes each record as one line to whatever ``sys.stderr`` is at the time (a test or
    a notebook may swap it); never raises."""

    def __init__(self) -> None:
        super().__init__()
        self.setFormatter(logging.Formatter("trainprof: %(message)s"))

    def emit(self, record: logging.LogRecord) -> None:
        try:
            sys.stderr.write(self.format(record) + "\n")
            sys.stderr.flush()
        except Exception:  # stderr closed or broken: nothing better to do
            pass


if not logger.handlers:
    logger.addHandler(_StderrHandler())
    logger.setLevel(logging.INFO)
    logger.propagate = False

_seen: set[Hashable] = set()
_lock = threading.Lock()


def _first(key: Hashable) -> bool:
    with _lock:
        if key in _seen:
            return False
        _seen.add(key)
        return True


def log(message: str, key: Optional[Hashable] = None, level: int = logging.WARNING) -> None:
    """Logs ``message`` unless a message with the same ``key`` (default: the message) was
    logged already in this process. Never raises."""
    try:
        if _first(message if key is None else key):
            logger.log(level, "%s", message)
    except Exception:
        pass


def warn_user(message: str, stacklevel: int = 2, key: Optional[Hashable] = None) -> None:
    """Issues ``message`` as a :class:`TrainprofWarning` pointing ``stacklevel`` frames up
    (as ``warnings.warn`` counts them, from the caller of this function). With ``key``,
    at most once per process (``warnings`` shows a message once per place; ``key`` is for
    a message that several places can issue). Never raises: a warning the filters turn
    into an exception is logged instead."""
    try:
        if key is not None and not _first(key):
            return
        warnings.warn(message, TrainprofWarning, stacklevel=stacklevel + 1)
    except Exception:
        log(message, key=("warning", message))
