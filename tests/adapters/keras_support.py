"""A Keras-shaped training run through trainprof.keras.ProfilerCallback, without TensorFlow:
run as a script in a subprocess by test_keras_adapter.py (``run_trainer``).

A fake ``tensorflow`` module goes into ``sys.modules`` before the callback is made. It has
what the callback uses, behaving as TF's does: ``tf.keras.callbacks.Callback`` (the base
class), ``tf.profiler.experimental.start(logdir)`` / ``stop()`` (one session at a time;
``stop`` writes ``plugins/profile/<YYYY_MM_DD_HH_MM_SS>/<host>.xplane.pb`` as TF 2.11+ does,
or ``<host>.trace.json.gz`` as older TF did) and the XSpace protobuf module
``tensorflow.tsl.profiler.protobuf.xplane_pb2``. While a session runs, ``op(name)`` records
one host event, timestamps relative to the session start, as TF's are. ``fit`` /
``evaluate`` / ``predict`` call the callback's hooks in the order Keras calls them.

TRAINPROF_TEST_PARAMS (JSON):
* ``tf``: "xplane" (default) | "json" | "no_profiler" (tensorflow without tf.profiler) |
  "busy" (start raises, as when another profiler runs) | "absent" (no tensorflow, no keras);
* ``no_xplane_module``: true to leave out the XSpace protobuf module;
* ``epochs``, ``steps``, ``val_steps``, ``eval_steps``, ``predict_steps``;
* ``op_bytes``: bytes each op keeps while a session runs (TF's buffers growing), freed at
  ``stop``.
"""

import json
import os
import socket
import sys
import time
import types

PARAMS = json.loads(os.environ.get("TRAINPROF_TEST_PARAMS") or "{}")
TF = PARAMS.get("tf", "xplane")
HOST = socket.gethostname()


# --- the fake XSpace protobuf: the fields trainprof reads, serialised as JSON --------------


class _Msg:
    def __init__(self, **kw):
        self.__dict__.update(kw)


class _Stat(_Msg):
    def WhichOneof(self, group):
        assert group == "value"
        return "uint64_value" if hasattr(self, "uint64_value") else None


class XSpace:
    def __init__(self):
        self.planes = []

    def ParseFromString(self, data):
        doc = json.loads(data.decode("utf-8"))
        for p in doc["planes"]:
            self.planes.append(
                _Msg(
                    name=p["name"],
                    event_metadata={int(k): _Msg(name=v, display_name="") for k, v in p["event_metadata"].items()},
                    stat_metadata={int(k): _Msg(name=v) for k, v in p["stat_metadata"].items()},
                    stats=[_Stat(metadata_id=s[0], uint64_value=s[1]) for s in p["stats"]],
                    lines=[
                        _Msg(
                            id=ln["id"],
                            display_id=0,
                            name=ln["name"],
                            display_name="",
                            timestamp_ns=ln["timestamp_ns"],
                            events=[_Msg(metadata_id=e[0], offset_ps=e[1], duration_ps=e[2]) for e in ln["events"]],
                        )
                        for ln in p["lines"]
                    ],
                )
            )


# --- the fake TF profiler -------------------------------------------------------------------


class _Profiler:
    def __init__(self):
        self.logdir = None
        self.start_ns = 0
        self.events = []  # (name, start ns, duration ns)
        self.calls = []
        self.starts_ns = []  # when each session started, as TF counts its trace times from
        self.held = []  # what the session's ops keep (``op_bytes``)

    def start(self, logdir, options=None):
        self.calls.append(("start", logdir))
        if TF == "busy":
            raise RuntimeError("Another profiler is running.")
        if self.logdir is not None:
            raise RuntimeError("Another profiler is running.")
        self.logdir = logdir
        self.start_ns = time.time_ns()
        self.starts_ns.append(self.start_ns)
        self.events = []

    def stop(self):
        self.calls.append(("stop", self.logdir))
        if self.logdir is None:
            raise RuntimeError("Cannot stop profiling. No profiler is running.")
        stop_ns = time.time_ns()
        run = os.path.join(self.logdir, "plugins", "profile", time.strftime("%Y_%m_%d_%H_%M_%S"))
        os.makedirs(run, exist_ok=True)
        names = sorted({n for n, _, _ in self.events})
        ids = {n: i + 1 for i, n in enumerate(names)}
        if TF == "json":  # TF < 2.11: TF writes the trace viewer file itself
            evs = [{"name": "process_name", "ph": "M", "pid": 1, "args": {"name": "/host:CPU"}}]
            evs += [
                {"name": n, "ph": "X", "pid": 1, "tid": 7, "ts": (s - self.start_ns) / 1e3, "dur": d / 1e3}
                for n, s, d in self.events
            ]
            import gzip

            with gzip.open(os.path.join(run, HOST + ".trace.json.gz"), "wb") as f:
                f.write(json.dumps({"traceEvents": evs}).encode())
        else:
            space = {
                "planes": [
                    {
                        "name": "/host:CPU",
                        "event_metadata": {str(i): n for n, i in ids.items()},
                        "stat_metadata": {},
                        "stats": [],
                        "lines": [
                            {
                                "id": 7,
                                "name": "python",
                                "timestamp_ns": 1000,
                                "events": [
                                    [ids[n], (s - self.start_ns - 1000) * 1000, d * 1000] for n, s, d in self.events
                                ],
                            }
                        ],
                    },
                    {  # TF's session times, in a plane without lines
                        "name": "Task Environment",
                        "event_metadata": {},
                        "stat_metadata": {"1": "profile_start_time", "2": "profile_stop_time"},
                        "stats": [[1, self.start_ns], [2, stop_ns]],
                        "lines": [],
                    },
                ]
            }
            with open(os.path.join(run, HOST + ".xplane.pb"), "wb") as f:
                f.write(json.dumps(space).encode())
        self.logdir = None
        self.held = []

    def op(self, name, ms=0.5):
        """Work of ``ms`` milliseconds, recorded when a session runs."""
        start = time.time_ns()
        end = start + int(ms * 1e6)
        while time.time_ns() < end:
            pass
        if self.logdir is not None:
            self.events.append((name, start, time.time_ns() - start))
            if PARAMS.get("op_bytes"):
                self.held.append(b"\x01" * PARAMS["op_bytes"])  # written, so resident


PROFILER = _Profiler()


class Callback:
    """tf.keras.callbacks.Callback's shape: ``set_model`` / ``model``, every hook a no-op."""

    def __init__(self):
        self.model = None
        self.params = {}

    def set_model(self, model):
        self.model = model

    def set_params(self, params):
        self.params = params


for _hook in [
    "on_%s_%s" % (what, edge)
    for what in ("train", "test", "predict", "epoch", "train_batch", "test_batch", "predict_batch")
    for edge in ("begin", "end")
]:
    setattr(Callback, _hook, lambda self, *args, **kwargs: None)


def install_fake_tensorflow():
    tf = types.ModuleType("tensorflow")
    tf.__version__ = "2.99.0-fake"
    tf.keras = types.SimpleNamespace(callbacks=types.SimpleNamespace(Callback=Callback))
    if TF != "no_profiler":
        tf.profiler = types.SimpleNamespace(
            experimental=types.SimpleNamespace(start=PROFILER.start, stop=PROFILER.stop)
        )
    sys.modules["tensorflow"] = tf
    if not PARAMS.get("no_xplane_module"):
        for name in ("tensorflow.tsl", "tensorflow.tsl.profiler", "tensorflow.tsl.profiler.protobuf"):
            sys.modules[name] = types.ModuleType(name)
        pb2 = types.ModuleType("tensorflow.tsl.profiler.protobuf.xplane_pb2")
        pb2.XSpace = XSpace
        sys.modules[pb2.__name__] = pb2


class _Blocked:
    """A meta-path finder that makes ``tensorflow`` and ``keras`` unimportable."""

    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("tensorflow", "keras"):
            raise ImportError("No module named %r (blocked by the test)" % name)
        return None


# --- Keras' calling order -------------------------------------------------------------------


def run_batches(cb, kind, n, log):
    for b in range(n):
        getattr(cb, "on_%s_batch_begin" % kind)(b, None)
        PROFILER.op("%s_function" % kind)
        getattr(cb, "on_%s_batch_end" % kind)(b, {"loss": 0.1})
        log.append([kind, b])


def call(cb, hook, *args):
    """Calls ``hook`` when ``cb`` has it (a callback on ``object`` has only its own)."""
    fn = getattr(cb, hook, None)
    if fn is not None:
        fn(*args)


def fit(cb, epochs, steps, val_steps, log):
    call(cb, "on_train_begin")
    for epoch in range(epochs):
        call(cb, "on_epoch_begin", epoch)
        run_batches(cb, "train", steps, log)
        if val_steps:
            call(cb, "on_test_begin")
            run_batches(cb, "test", val_steps, log)
            call(cb, "on_test_end")
        call(cb, "on_epoch_end", epoch)
    call(cb, "on_train_end")


def main():
    if TF == "absent":
        sys.meta_path.insert(0, _Blocked())
    else:
        install_fake_tensorflow()
    import trainprof.keras

    r = {"pid": os.getpid(), "host": HOST}
    cls = trainprof.keras.ProfilerCallback
    r["base"] = [c.__module__ + "." + c.__qualname__ for c in cls.__mro__]
    cb = cls()
    r["node_id"] = cb.profiler.node_id if cb.profiler else None
    log = []
    running = []
    orig_end = cb.on_train_batch_end

    def on_train_batch_end(batch, logs=None):  # records, per train step, whether TF still runs after it
        orig_end(batch, logs)
        running.append(cb.detailed_running)

    cb.on_train_batch_end = on_train_batch_end
    fit(cb, PARAMS.get("epochs", 2), PARAMS.get("steps", 5), PARAMS.get("val_steps", 2), log)
    r["running_after_fit"] = cb.detailed_running
    run_batches(cb, "test", PARAMS.get("eval_steps", 2), log)
    run_batches(cb, "predict", PARAMS.get("predict_steps", 2), log)
    cb.close()
    cb.close()
    r["running_after_train_batch"] = running
    r["tf_calls"] = PROFILER.calls
    r["tf_starts_ns"] = PROFILER.starts_ns
    r["batches"] = log
    r["stats"] = cb.profiler.stats() if cb.profiler else None
    r["modules"] = sorted(m for m in sys.modules if m.split(".")[0] in ("tensorflow", "keras"))
    with open(os.environ["TRAINPROF_TEST_MANIFEST"], "w") as f:
        json.dump(r, f)


if __name__ == "__main__":
    main()
