"""Calls the C ABI through the package's ctypes binding with bad arguments; writes every
status it got into the manifest. Run in a subprocess by test_package.py."""

import ctypes
import json
import os

from trainprof import _lib

lib = _lib.load()
W = _lib.TrainprofPythonWindow
out_id = ctypes.c_uint32()
out_i32 = ctypes.c_int32()
r = {}


def step_next(mode=_lib.MODE_TRAIN, null=None):
    """trainprof_step_next with out-values set to sentinels first: [status, step,
    window ended, window started, detailed] (what the outs hold afterwards)."""
    outs = [ctypes.c_int64(77), W(), ctypes.c_int32(77)]
    outs[1].ended = outs[1].started = 77
    refs = [None if i == null else ctypes.byref(o) for i, o in enumerate(outs)]
    status = lib.trainprof_step_next(mode, -1, *refs)
    return [status, outs[0].value, outs[1].ended, outs[1].started, outs[2].value]


r["step_next"] = {"before_init": step_next()}

r["abi_version"] = lib.trainprof_abi_version()
r["version"] = lib.trainprof_version().decode()

# Before init: positive "did nothing" statuses.
r["before_init"] = {
    "register_name": lib.trainprof_register_name(b"x", ctypes.byref(out_id)),
    "step_begin": lib.trainprof_step_begin(1, -1, None),
    "step_end": lib.trainprof_step_end(),
    "record": lib.trainprof_record(0, 0, 1, 2, -1, None, 0),
    "shutdown": lib.trainprof_shutdown(10),
    "python_boundary": lib.trainprof_python_boundary(1, ctypes.byref(W())),
    "dropped": lib.trainprof_dropped_events(),
}

# trainprof_init's argument.
r["init_null"] = lib.trainprof_init(None)
r["init_bad_utf8"] = lib.trainprof_init(b"py\xfftorch")
r["init_unknown_framework"] = lib.trainprof_init(b"caffe")
r["init"] = lib.trainprof_init(b"pytorch")
r["init_again"] = lib.trainprof_init(b"pytorch")

# NULL pointers.
r["null"] = {
    "register_name_name": lib.trainprof_register_name(None, ctypes.byref(out_id)),
    "register_name_out": lib.trainprof_register_name(b"ok", None),
    "record_args": lib.trainprof_record(0, 0, 1, 2, -1, None, 1),
    "window_active_out": lib.trainprof_window_active(_lib.FEATURE_DETAILED, -1, None, None),
    "window_active_dataloader_name": lib.trainprof_window_active(
        _lib.FEATURE_DATALOADER, -1, None, ctypes.byref(out_i32)
    ),
    "python_boundary_out": lib.trainprof_python_boundary(_lib.BOUNDARY_STEP_START, None),
    "node_id_buf": lib.trainprof_node_id(None, 64),
    "stats_out": lib.trainprof_stats(None),
}
# Strings that are not UTF-8.
r["utf8"] = {
    "register_name": lib.trainprof_register_name(b"\xc3\x28", ctypes.byref(out_id)),
    "window_active_dataloader": lib.trainprof_window_active(
        _lib.FEATURE_DATALOADER, -1, b"\xff\xfeGetNext", ctypes.byref(out_i32)
    ),
}
# Out-of-range arguments.
lib.trainprof_register_name(b"Forward", ctypes.byref(out_id))
fwd = out_id.value
r["invalid"] = {
    "step_begin_mode": lib.trainprof_step_begin(9, -1, None),
    "window_active_feature": lib.trainprof_window_active(99, -1, None, ctypes.byref(out_i32)),
    "python_boundary_kind": lib.trainprof_python_boundary(42, ctypes.byref(W())),
    "record_end_before_start": lib.trainprof_record(fwd, fwd, 10, 5, -1, None, 0),
    "record_unknown_name": lib.trainprof_record(fwd, 100000, 1, 2, -1, None, 0),
    "record_five_args": lib.trainprof_record(fwd, fwd, 1, 2, -1, (_lib.TrainprofArg * 5)(), 5),
    "record_bad_arg_kind": lib.trainprof_record(
        fwd, fwd, 1, 2, -1, (_lib.TrainprofArg * 1)(_lib.TrainprofArg(fwd, 7, 1)), 1
    ),
}
# trainprof_step_next: nothing done (no step begun: after_panic's step is still 0).
r["step_next"]["null"] = [step_next(null=i) for i in range(3)]
r["step_next"]["invalid_mode"] = step_next(mode=9)
r["node_id_small_buffer"] = lib.trainprof_node_id(ctypes.create_string_buffer(1), 1)
r["step_end_without_step"] = lib.trainprof_step_end()

# A panic inside the library is caught: INTERNAL, and everything goes on working.
r["selftest_panic"] = lib.trainprof_selftest_panic()
r["selftest_panic_again"] = lib.trainprof_selftest_panic()
out_step = ctypes.c_int64(-1)
r["after_panic"] = {
    "step_begin": lib.trainprof_step_begin(_lib.MODE_TRAIN, -1, ctypes.byref(out_step)),
    "step": out_step.value,
    "record": lib.trainprof_record(fwd, fwd, lib.trainprof_now_us() - 5, lib.trainprof_now_us(), -1, None, 0),
    "step_end": lib.trainprof_step_end(),
    "shutdown": lib.trainprof_shutdown(10000),
}
stats = _lib.TrainprofStats()
lib.trainprof_stats(ctypes.byref(stats))
r["written"] = stats.written
r["after_shutdown"] = {
    "record": lib.trainprof_record(fwd, fwd, 1, 2, -1, None, 0),
    "init": lib.trainprof_init(b"pytorch"),
    "shutdown": lib.trainprof_shutdown(10),
}
r["step_next"]["after_shutdown"] = step_next()

with open(os.environ["TRAINPROF_TEST_MANIFEST"], "w") as f:
    json.dump(r, f)
print("still alive")
