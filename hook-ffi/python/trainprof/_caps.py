"""Window caps (docs/formats.md, "Window caps"): how much one window may capture, as the
library reads ``WindowCapsConfig``, the trainer's resident memory read cheaply, and the call
that stops a window at its cap.

The adapters count what their window captures and check it where they can act (a step
boundary inside the window; each event they write); at a cap they stop the window's
profiler and call :func:`capped`: the library then answers no for the rest of the window's
steps and writes one ``trainprof:WindowCapped`` instant event and one log line.
"""

from __future__ import annotations

import ctypes
import os
from typing import Dict, Optional

from . import _lib

__all__ = ["CAPS", "DEFAULTS", "caps", "capped", "rss_bytes"]

#: The cap words of :func:`capped` and their ``TrainprofCap``.
CAPS: Dict[str, int] = {"events": _lib.CAP_EVENTS, "bytes": _lib.CAP_BYTES, "samples": _lib.CAP_SAMPLES}

#: The defaults (``config/src/caps.rs``), for a library without ``trainprof_window_caps``.
DEFAULTS: Dict[str, int] = {
    "detailed_max_events": 2_000_000,
    "detailed_max_bytes": 512 << 20,
    "dataloader_max_events": 100_000,
    "python_max_samples": 1_000_000,
}

_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def caps(lib: _lib.Library) -> Dict[str, int]:
    """The caps as the library now reads them (the defaults when it cannot say)."""
    if not _lib.has(lib, "trainprof_window_caps"):
        return dict(DEFAULTS)
    out = _lib.TrainprofWindowCaps()
    status: int = lib.trainprof_window_caps(ctypes.byref(out))
    if status != _lib.STATUS_OK:
        return dict(DEFAULTS)
    return {field[0]: int(getattr(out, field[0])) for field in _lib.TrainprofWindowCaps._fields_}


def capped(lib: _lib.Library, feature: int, cap: str, value: int, limit: int, step: Optional[int] = None) -> bool:
    """Tells the library that ``feature``'s window (a ``FEATURE_*``) stopped at its cap
    ``cap`` (``events``, ``bytes``, ``samples``), having reached ``value`` of ``limit``, at
    ``step`` (default: the current one). True when the library took it (False: capped
    already, or a library without the call)."""
    if not _lib.has(lib, "trainprof_window_capped"):
        return False
    s = -1 if step is None else int(step)
    status: int = lib.trainprof_window_capped(feature, CAPS[cap], max(0, int(value)), max(0, int(limit)), s)
    return status == _lib.STATUS_OK


def rss_bytes() -> int:
    """The process's resident memory in bytes (``/proc/self/statm``'s second field); 0
    where it cannot be read."""
    try:
        with open("/proc/self/statm", "rb") as f:
            return int(f.read().split()[1]) * _PAGE
    except (OSError, ValueError, IndexError):
        return 0
