"""A small real Keras training run through trainprof.keras.ProfilerCallback; run in a
subprocess by test_keras_real.py. Writes what it did into $TRAINPROF_TEST_MANIFEST."""

import json
import os
import time

t0 = time.perf_counter()
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import trainprof.keras  # noqa: E402

PARAMS = json.loads(os.environ.get("TRAINPROF_TEST_PARAMS") or "{}")
EPOCHS = PARAMS.get("epochs", 2)
SAMPLES = PARAMS.get("samples", 64)
BATCH = PARAMS.get("batch", 8)
import_s = time.perf_counter() - t0

rng = np.random.default_rng(0)
x = rng.random((SAMPLES, 16), dtype=np.float32)
y = rng.random((SAMPLES, 4), dtype=np.float32)
xv, yv = x[:16], y[:16]

model = tf.keras.Sequential(
    [tf.keras.Input((16,)), tf.keras.layers.Dense(32, activation="relu"), tf.keras.layers.Dense(4)]
)
model.compile(optimizer="sgd", loss="mse")

cb = trainprof.keras.ProfilerCallback()
r = {
    "import_s": import_s,
    "tf_version": tf.__version__,
    "callback_bases": [c.__module__ + "." + c.__qualname__ for c in type(cb).__mro__],
    "node_id": cb.profiler.node_id,
    "pid": os.getpid(),
}
t = time.perf_counter()
model.fit(x, y, batch_size=BATCH, epochs=EPOCHS, validation_data=(xv, yv), callbacks=[cb], verbose=0)
r["fit_s"] = time.perf_counter() - t
r["running_after_fit"] = cb.detailed_running
model.evaluate(xv, yv, batch_size=BATCH, callbacks=[cb], verbose=0)
model.predict(xv, batch_size=BATCH, callbacks=[cb], verbose=0)
cb.close()
r["stats"] = cb.profiler.stats()
r["detailed_stop_us"] = cb._detailed.last_stop_us
with open(os.environ["TRAINPROF_TEST_MANIFEST"], "w") as f:
    json.dump(r, f)
