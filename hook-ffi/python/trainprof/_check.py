"""Argument checks of :class:`trainprof.Profiler`: a wrong argument is a ``ValueError``
with a message that names it, raised before anything reaches the library."""

from __future__ import annotations

import numbers
import struct
from typing import Tuple

from . import _lib

I64_MIN = -(2**63)
I64_MAX = 2**63 - 1


def encode_name(what: str, name: object) -> bytes:
    """``name`` (a str without NUL) as UTF-8."""
    if not isinstance(name, str):
        raise ValueError("%s must be a str, not %s" % (what, type(name).__name__))
    if "\0" in name:
        raise ValueError("%s must not contain NUL characters: %r" % (what, name))
    try:
        return name.encode("utf-8")
    except UnicodeEncodeError as e:
        raise ValueError("%s is not encodable as UTF-8: %r (%s)" % (what, name, e)) from None


def int64(what: str, v: object) -> int:
    """``v``, an integer (not a bool) in the int64 range."""
    if isinstance(v, bool) or not isinstance(v, numbers.Integral):
        raise ValueError("%s must be an int, not %s" % (what, type(v).__name__))
    i = int(v)
    if not I64_MIN <= i <= I64_MAX:
        raise ValueError("%s is out of the int64 range: %d" % (what, i))
    return i


def time_us(what: str, v: object) -> int:
    """An event time: an int, or a float truncated as smdebug truncates (``int(t * 1e6)``)."""
    if isinstance(v, numbers.Real) and not isinstance(v, (bool, numbers.Integral)):
        f = float(v)
        if f != f or f in (float("inf"), float("-inf")):
            raise ValueError("%s must be finite, not %r" % (what, v))
        v = int(f)
    return int64(what, v)


def step(v: object) -> int:
    """``None`` or -1 -> -1 (the library's current / next step), else a non-negative int."""
    if v is None:
        return -1
    s = int64("step", v)
    if s < -1:
        raise ValueError("step must be >= 0, or None / -1 for the default, not %d" % s)
    return s


def arg_value(key: object, v: object) -> Tuple[int, int]:
    """(kind, int64 value) of one event argument."""
    if isinstance(v, bool) or type(v).__name__ == "bool_":  # bool, numpy.bool_
        return _lib.ARG_KIND_BOOL, 1 if v else 0
    if isinstance(v, numbers.Integral):
        return _lib.ARG_KIND_INT, int64("args[%r]" % (key,), v)
    if isinstance(v, numbers.Real):
        bits: int = struct.unpack("<q", struct.pack("<d", float(v)))[0]
        return _lib.ARG_KIND_FLOAT, bits
    raise ValueError("args[%r] must be an int, float or bool, not %s" % (key, type(v).__name__))
