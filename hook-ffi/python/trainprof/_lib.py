"""ctypes binding of ``libtrainprof_hook.so`` (``hook-ffi/include/trainprof_hook.h``).

Every structure mirrors the header field for field, and every exported function gets its
``argtypes`` / ``restype`` here, so a wrong call is a ``ctypes.ArgumentError`` in Python
rather than undefined behaviour in C. Nothing here runs at import time: :func:`load` opens
the library when a :class:`trainprof.Profiler` is made.
"""

from __future__ import annotations

import ctypes
import os
import threading
import time
from typing import Any, Callable, Dict, Optional, Tuple, Union

#: The ABI this package speaks (``TRAINPROF_ABI_VERSION``).
ABI_VERSION = 3
#: ``TRAINPROF_PATH_MAX``: bytes in each path buffer of :class:`TrainprofPythonWindow`.
PATH_MAX = 4096
#: ``TRAINPROF_MAX_ARGS``: extra arguments per event.
MAX_ARGS = 4
#: ``TRAINPROF_NAME_OVER_LIMIT``: the id of a name that did not fit in the name table.
NAME_OVER_LIMIT = 2**32 - 1

#: The library's file name, looked for inside this package when ``TRAINPROF_HOOK_LIB`` is unset.
LIB_NAME = "libtrainprof_hook.so"
#: The environment variable naming the library to load.
LIB_ENV = "TRAINPROF_HOOK_LIB"

# enum TrainprofStatus
STATUS_OK = 0
STATUS_NOT_INITIALIZED = 1
STATUS_SHUT_DOWN = 2
STATUS_DISABLED = 3
STATUS_FORKED_CHILD = 4
STATUS_DROPPED = 5
STATUS_TIMEOUT = 6
STATUS_NO_STEP = 7
STATUS_NAME_LIMIT = 8
STATUS_NULL_ARGUMENT = -1
STATUS_INVALID_UTF8 = -2
STATUS_INVALID_ARGUMENT = -3
STATUS_INTERNAL = -4
STATUS_IO = -5
STATUS_BUFFER_TOO_SMALL = -6

#: ``OK``, ``DISABLED``, ... by code: made from the ``STATUS_*`` constants above, the one
#: place the codes are written in Python (``tests/hook/test_header.py`` checks them against
#: ``trainprof_hook.h``).
STATUS_NAMES = {v: k[len("STATUS_") :] for k, v in dict(globals()).items() if k.startswith("STATUS_")}

# enum TrainprofMode
MODE_TRAIN = 1
MODE_EVAL = 2
MODE_PREDICT = 3
MODE_GLOBAL = 4

# enum TrainprofFeature
FEATURE_DETAILED = 1
FEATURE_DATALOADER = 2
FEATURE_PYTHON = 3
FEATURE_SMDATAPARALLEL = 4
FEATURE_NATIVE = 5
FEATURE_MEMORY = 6

# enum TrainprofStacks
STACKS_PYTHON = 1
STACKS_ALL = 2

# enum TrainprofSnapshotKind
SNAPSHOT_KIND_WINDOW = 1
SNAPSHOT_KIND_OOM = 2

# enum TrainprofStepNext: the bits of trainprof_step_next's out_windows
STEP_NEXT_DETAILED = 1
STEP_NEXT_MEMORY = 2

# enum TrainprofBoundary
BOUNDARY_START = 1
BOUNDARY_STEP_START = 2
BOUNDARY_FORWARD_PASS_END = 3
BOUNDARY_STEP_END = 4
BOUNDARY_CLOSE = 5
BOUNDARY_EXIT = 6

# enum TrainprofArgKind
ARG_KIND_INT = 0
ARG_KIND_FLOAT = 1
ARG_KIND_BOOL = 2

# enum TrainprofPythonProfiler
PYTHON_PROFILER_NONE = 0
PYTHON_PROFILER_CPROFILE = 1
PYTHON_PROFILER_PYINSTRUMENT = 2

# enum TrainprofCprofileTimer
CPROFILE_TIMER_NONE = 0
CPROFILE_TIMER_TOTAL_TIME = 1
CPROFILE_TIMER_CPU_TIME = 2
CPROFILE_TIMER_OFF_CPU_TIME = 3

# enum TrainprofCap
CAP_EVENTS = 1
CAP_BYTES = 2
CAP_SAMPLES = 3


def status_name(status: int) -> str:
    """``OK``, ``DISABLED``, ... for a status code (``STATUS_<n>`` for an unknown one)."""
    return STATUS_NAMES.get(status, "STATUS_%d" % status)


class TrainprofArg(ctypes.Structure):
    """``struct TrainprofArg``: ``args.<name of key> = value``."""

    _fields_ = [
        ("key", ctypes.c_uint32),
        ("kind", ctypes.c_int32),
        ("value", ctypes.c_int64),
    ]


class TrainprofPythonWindow(ctypes.Structure):
    """``struct TrainprofPythonWindow``: what ``trainprof_python_boundary`` decided."""

    _fields_ = [
        ("ended", ctypes.c_int32),
        ("started", ctypes.c_int32),
        ("profiler", ctypes.c_int32),
        ("timer", ctypes.c_int32),
        ("ended_dir", ctypes.c_char * PATH_MAX),
        ("ended_tmp_dir", ctypes.c_char * PATH_MAX),
    ]


class TrainprofStats(ctypes.Structure):
    """``struct TrainprofStats``: the hook's counters."""

    _fields_ = [
        ("dropped_queue_full", ctypes.c_uint64),
        ("dropped_writer", ctypes.c_uint64),
        ("written", ctypes.c_uint64),
        ("files_sealed", ctypes.c_uint64),
        ("open_failures", ctypes.c_uint64),
    ]


class TrainprofMemorySettings(ctypes.Structure):
    """``struct TrainprofMemorySettings``: what ``MemoryProfilingConfig`` asks for
    (docs/formats.md, "Memory windows")."""

    _fields_ = [
        ("max_entries", ctypes.c_uint64),
        ("enabled", ctypes.c_int32),
        ("oom_snapshot", ctypes.c_int32),
        ("stacks", ctypes.c_int32),
    ]


class TrainprofWindowCaps(ctypes.Structure):
    """``struct TrainprofWindowCaps``: the caps of every window (docs/formats.md, "Window caps")."""

    _fields_ = [
        ("detailed_max_events", ctypes.c_uint64),
        ("detailed_max_bytes", ctypes.c_uint64),
        ("dataloader_max_events", ctypes.c_uint64),
        ("python_max_samples", ctypes.c_uint64),
    ]


_Status = ctypes.c_int32  # TrainprofStatus is an int32_t in C

#: A ctypes type, as ``restype`` / ``argtypes`` take them.
CType = Any

# name -> (restype, argtypes), every export of trainprof_hook.h.
_PROTOTYPES: Dict[str, Tuple[CType, "list[CType]"]] = {
    "trainprof_abi_version": (ctypes.c_uint32, []),
    "trainprof_version": (ctypes.c_char_p, []),
    "trainprof_init": (_Status, [ctypes.c_char_p]),
    "trainprof_shutdown": (_Status, [ctypes.c_uint32]),
    "trainprof_register_name": (_Status, [ctypes.c_char_p, ctypes.POINTER(ctypes.c_uint32)]),
    "trainprof_record": (
        _Status,
        [
            ctypes.c_uint32,
            ctypes.c_uint32,
            ctypes.c_int64,
            ctypes.c_int64,
            ctypes.c_int64,
            ctypes.POINTER(TrainprofArg),
            ctypes.c_uint32,
        ],
    ),
    "trainprof_step_begin": (_Status, [ctypes.c_int32, ctypes.c_int64, ctypes.POINTER(ctypes.c_int64)]),
    "trainprof_step_end": (_Status, []),
    "trainprof_now_us": (ctypes.c_int64, []),
    "trainprof_window_active": (
        _Status,
        [ctypes.c_int32, ctypes.c_int64, ctypes.c_char_p, ctypes.POINTER(ctypes.c_int32)],
    ),
    "trainprof_python_boundary": (_Status, [ctypes.c_int32, ctypes.POINTER(TrainprofPythonWindow)]),
    "trainprof_step_next": (
        _Status,
        [
            ctypes.c_int32,
            ctypes.c_int64,
            ctypes.POINTER(ctypes.c_int64),
            ctypes.POINTER(TrainprofPythonWindow),
            ctypes.POINTER(ctypes.c_int32),
        ],
    ),
    "trainprof_node_id": (_Status, [ctypes.c_char_p, ctypes.c_size_t]),
    "trainprof_local_path": (_Status, [ctypes.c_char_p, ctypes.c_size_t]),
    "trainprof_stats": (_Status, [ctypes.POINTER(TrainprofStats)]),
    "trainprof_cost_add": (_Status, [ctypes.c_char_p, ctypes.c_uint64, ctypes.c_uint64]),
    "trainprof_dropped_events": (ctypes.c_uint64, []),
    "trainprof_dropped_names": (ctypes.c_uint64, []),
    "trainprof_selftest_panic": (_Status, []),
    "trainprof_hang_enabled": (ctypes.c_int32, []),
    "trainprof_hang_python": (_Status, [ctypes.c_int32, ctypes.c_int32]),
    "trainprof_hang_free_signal": (ctypes.c_int32, []),
    "trainprof_hang_arm_crash": (_Status, [ctypes.c_int32]),
    "trainprof_hang_exception": (_Status, [ctypes.c_char_p]),
    "trainprof_window_caps": (_Status, [ctypes.POINTER(TrainprofWindowCaps)]),
    "trainprof_window_capped": (
        _Status,
        [ctypes.c_int32, ctypes.c_int32, ctypes.c_uint64, ctypes.c_uint64, ctypes.c_int64],
    ),
    "trainprof_torch_trace_create": (_Status, [ctypes.c_char_p, ctypes.c_size_t, ctypes.POINTER(ctypes.c_uint64)]),
    "trainprof_torch_trace_import": (
        _Status,
        [
            ctypes.c_uint64,
            ctypes.POINTER(ctypes.c_int64),
            ctypes.POINTER(ctypes.c_int64),
            ctypes.c_uint32,
            ctypes.c_uint64,
            ctypes.c_uint64,
            ctypes.c_int32,
        ],
    ),
    "trainprof_torch_trace_discard": (_Status, [ctypes.c_uint64]),
    "trainprof_memory_settings": (_Status, [ctypes.POINTER(TrainprofMemorySettings)]),
    "trainprof_memory_snapshot_create": (
        _Status,
        [
            ctypes.c_int32,
            ctypes.c_int64,
            ctypes.c_int64,
            ctypes.c_char_p,
            ctypes.c_size_t,
            ctypes.POINTER(ctypes.c_int32),
        ],
    ),
}


#: Exports added after ABI version 1 without a bump (adding an export changes no other
#: one's meaning): a library that lacks one still loads, and the package asks for it with
#: :func:`has`.
_OPTIONAL = frozenset(
    {
        "trainprof_local_path",
        "trainprof_step_next",
        "trainprof_hang_enabled",
        "trainprof_hang_python",
        "trainprof_hang_exception",
        "trainprof_window_caps",
        "trainprof_window_capped",
        "trainprof_torch_trace_create",
        "trainprof_torch_trace_import",
        "trainprof_torch_trace_discard",
        "trainprof_memory_settings",
        "trainprof_memory_snapshot_create",
    }
)


class LibraryError(ImportError):
    """The hook library cannot be loaded, or speaks another ABI."""


def _answer_disabled(*_args: object) -> int:
    return STATUS_DISABLED


class NullLibrary:
    """Stands in for the library where none is loaded (``TRAINPROF_DISABLE``, or no loadable
    library): every export does nothing and answers ``DISABLED``, output arguments stay as
    the caller made them (zeros), the clock still runs and nothing was dropped."""

    def trainprof_abi_version(self) -> int:
        return ABI_VERSION

    def trainprof_version(self) -> Optional[bytes]:
        return None

    def trainprof_now_us(self) -> int:
        return time.time_ns() // 1000

    def trainprof_dropped_events(self) -> int:
        return 0

    def trainprof_dropped_names(self) -> int:
        return 0

    def __getattr__(self, name: str) -> Callable[..., int]:
        if name in _PROTOTYPES:
            return _answer_disabled
        raise AttributeError(name)


#: A loaded library (a bound ``ctypes.CDLL``) or the stand-in for none. Its exports are
#: called through ctypes, which mypy cannot see: they are typed where they are called.
Library = Union[ctypes.CDLL, NullLibrary]
#: A path argument.
PathLike = Union[str, bytes, "os.PathLike[str]", "os.PathLike[bytes]"]


def raw_function(lib: Library, name: str) -> Callable[..., Any]:
    """A function object of its own for export ``name`` of ``lib``, without ``argtypes``
    (the export itself of a :class:`NullLibrary`); AttributeError when ``lib`` lacks it.

    For the hot calls (an event, a step, a window question), which the package makes each
    in one place: ctypes then skips the per-argument ``from_param`` conversion of a bound
    export, which is most of a call's cost, so the caller passes ctypes objects of the
    declared C types (``c_int64``, ``c_uint32``, ``byref``, arrays) or small Python ints
    for ``int32_t``. Every other call goes through the bound exports (:func:`bind`)."""
    if isinstance(lib, NullLibrary):
        fn: Callable[..., Any] = getattr(lib, name)
        return fn
    fn = lib._FuncPtr((name, lib))
    fn.restype = _Status
    return fn


#: Values of ``TRAINPROF_DISABLE`` that leave profiling on (empty: not set), as the config
#: crate reads them (docs/configuration.md, "Overrides"); any other value switches it off.
_ENABLE_WORDS = ("", "0", "false", "no", "off")


def disabled_by_env() -> Optional[str]:
    """The ``TRAINPROF_DISABLE`` value when it switches profiling off, else None."""
    value = os.environ.get("TRAINPROF_DISABLE")
    if value is None or value.strip().lower() in _ENABLE_WORDS:
        return None
    return value


def default_path() -> str:
    """``libtrainprof_hook.so`` inside this package's directory, where the wheel puts it."""
    return os.path.join(os.path.dirname(os.path.abspath(__file__)), LIB_NAME)


def resolve_path(path: Optional[PathLike] = None) -> Tuple[str, str]:
    """The library to load: ``path``, else ``$TRAINPROF_HOOK_LIB``, else :func:`default_path`."""
    if path:
        return os.fsdecode(path), "the lib_path argument"
    env = os.environ.get(LIB_ENV)
    if env:
        return env, "$" + LIB_ENV
    return default_path(), "the trainprof package directory"


def _how_to_fix() -> str:
    # The wheel (`pip install .`, docs/install.md) carries the library at default_path(); a
    # package used from the source tree (PYTHONPATH=hook-ffi/python) has none there and needs
    # the variable.
    return (
        "install trainprof with pip (`pip install .` in its repository), which puts the library at %s, "
        "or set %s to the path of %s" % (default_path(), LIB_ENV, LIB_NAME)
    )


def bind(lib: ctypes.CDLL) -> ctypes.CDLL:
    """Sets ``restype`` / ``argtypes`` of every export on a ``ctypes.CDLL``; returns it."""
    for name, (restype, argtypes) in _PROTOTYPES.items():
        if name in _OPTIONAL and not hasattr(lib, name):
            continue
        fn = getattr(lib, name)  # AttributeError when the export is missing
        fn.restype = restype
        fn.argtypes = argtypes
    return lib


def has(lib: Library, name: str) -> bool:
    """Whether ``lib`` (a bound library or a :class:`NullLibrary`) has the export ``name``."""
    try:
        getattr(lib, name)
    except AttributeError:
        return False
    return True


def read_string(fn: Callable[[Any, int], int]) -> Optional[bytes]:
    """Calls ``fn(buf, cap)`` (an export that copies a NUL-terminated string into ``buf``)
    with growing buffers; the bytes, or None when it answers anything but ``OK`` and
    ``BUFFER_TOO_SMALL``."""
    for cap in (256, PATH_MAX, 65536):
        buf = ctypes.create_string_buffer(cap)
        status = fn(buf, cap)
        if status == STATUS_OK:
            return buf.value
        if status != STATUS_BUFFER_TOO_SMALL:
            return None
    return None


_cache: Dict[str, ctypes.CDLL] = {}
_cache_lock = threading.Lock()


def load(path: Optional[PathLike] = None) -> ctypes.CDLL:
    """Loads and binds the library (once per path), checking its ABI version.

    Raises :class:`LibraryError` (an ``ImportError``) with a message that names where the
    library was looked for and how to point the package at it.
    """
    where, source = resolve_path(path)
    with _cache_lock:
        lib = _cache.get(where)
        if lib is not None:
            return lib
        if not os.path.exists(where):
            raise LibraryError(
                "the hook library %s (from %s) does not exist; %s" % (where, source, _how_to_fix()),
                path=where,
            )
        try:
            lib = ctypes.CDLL(where)
        except OSError as e:
            raise LibraryError(
                "cannot load the hook library %s (from %s): %s; %s" % (where, source, e, _how_to_fix()),
                path=where,
            ) from e
        try:
            bind(lib)
        except AttributeError as e:
            raise LibraryError(
                "%s (from %s) is not a trainprof hook library (%s); %s" % (where, source, e, _how_to_fix()),
                path=where,
            ) from e
        abi: int = lib.trainprof_abi_version()
        if abi != ABI_VERSION:
            version: Optional[bytes] = lib.trainprof_version()
            raise LibraryError(
                "%s (from %s, version %s) has ABI version %d, this package needs %d; "
                "use the library built from the same trainprof release"
                % (where, source, version.decode("utf-8", "replace") if version else "?", abi, ABI_VERSION),
                path=where,
            )
        _cache[where] = lib
        return lib
