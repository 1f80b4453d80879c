"""A small training loop that needs only Python 3, profiled with the trainprof package.

    trainprof run -- python3 examples/train.py                       # built-in defaults
    SMPROFILER_CONFIG_PATH=examples/profilerconfig.json \\
        trainprof run -- python3 examples/train.py                   # every window opens

A two-layer perceptron learns a synthetic two-class problem with mini-batch SGD, in plain
Python (no numpy): a data loader builds the batches, each training step runs forward,
backward and the update, and every EVAL_EVERY steps an evaluation pass runs over held-out
batches. What trainprof sees of it:

* every step, train and eval, as a ``Step:ModeKeys.TRAIN`` / ``EVAL`` timeline event;
* inside the detailed-profiling window, ``Forward`` / ``Backward`` / ``Optimizer`` events
  per layer;
* inside the dataloader window, one ``DataLoaderIter`` event per batch fetched;
* inside the Python-profiling window, cProfile or pyinstrument stats per step, opened and
  closed by the package itself at step boundaries.

Settings come from the environment: TRAIN_STEPS (default 60), EVAL_EVERY (10), EVAL_STEPS
(3), BATCH (64), HIDDEN (64), SEED (0). It prints one line per ten steps and exits 0.
"""

import math
import os
import random
import sys
import time

try:
    import trainprof
except ImportError:  # run from a checkout: the package lives in hook-ffi/python
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "hook-ffi", "python"))
    import trainprof

FEATURES = 32


def env_int(name, default):
    try:
        return int(os.environ.get(name, default))
    except ValueError:
        sys.exit("%s must be an integer, not %r" % (name, os.environ[name]))


class Loader:
    """Batches of (x, y) drawn from two Gaussian blobs; the sleep stands for reading and
    decoding samples, so the dataloader has a visible cost in the timeline."""

    def __init__(self, batch, seed, read_s=0.002):
        self.batch = batch
        self.rng = random.Random(seed)
        self.read_s = read_s

    def __iter__(self):
        return self

    def __next__(self):
        time.sleep(self.read_s)
        xs, ys = [], []
        for _ in range(self.batch):
            y = self.rng.random() < 0.5
            centre = 0.6 if y else -0.6
            xs.append([self.rng.gauss(centre, 1.0) for _ in range(FEATURES)])
            ys.append(1.0 if y else 0.0)
        return xs, ys


class Linear:
    def __init__(self, n_in, n_out, rng):
        scale = 1.0 / math.sqrt(n_in)
        self.w = [[rng.uniform(-scale, scale) for _ in range(n_in)] for _ in range(n_out)]
        self.b = [0.0] * n_out

    def forward(self, xs):
        return [[sum(wi * xi for wi, xi in zip(row, x)) + b for row, b in zip(self.w, self.b)] for x in xs]

    def backward(self, xs, grad_out):
        """Gradients of the weights and biases, and of the input."""
        gw = [[0.0] * len(self.w[0]) for _ in self.w]
        gb = [0.0] * len(self.b)
        grad_in = []
        for x, g in zip(xs, grad_out):
            for j, gj in enumerate(g):
                if gj:
                    row = gw[j]
                    for i, xi in enumerate(x):
                        row[i] += gj * xi
                    gb[j] += gj
            grad_in.append([sum(g[j] * self.w[j][i] for j in range(len(g))) for i in range(len(x))])
        return gw, gb, grad_in

    def update(self, gw, gb, lr):
        for row, grow in zip(self.w, gw):
            for i, g in enumerate(grow):
                row[i] -= lr * g
        self.b = [b - lr * g for b, g in zip(self.b, gb)]


def sigmoid(z):
    return 1.0 / (1.0 + math.exp(-z)) if z >= 0 else math.exp(z) / (1.0 + math.exp(z))


class Model:
    def __init__(self, hidden, rng):
        self.l1 = Linear(FEATURES, hidden, rng)
        self.l2 = Linear(hidden, 1, rng)

    def forward(self, prof, xs, detailed):
        with prof.record("Forward", "Model.l1") if detailed else nullspan():
            h_pre = self.l1.forward(xs)
            h = [[v if v > 0 else 0.0 for v in row] for row in h_pre]
        with prof.record("Forward", "Model.l2") if detailed else nullspan():
            logits = [row[0] for row in self.l2.forward(h)]
        return h_pre, h, logits

    def loss(self, logits, ys):
        eps = 1e-9
        probs = [sigmoid(z) for z in logits]
        loss = -sum(y * math.log(p + eps) + (1 - y) * math.log(1 - p + eps) for p, y in zip(probs, ys)) / len(ys)
        correct = sum((p >= 0.5) == (y >= 0.5) for p, y in zip(probs, ys))
        return loss, correct, probs

    def train_step(self, prof, xs, ys, lr, detailed):
        h_pre, h, logits = self.forward(prof, xs, detailed)
        loss, correct, probs = self.loss(logits, ys)
        prof.forward_end()
        n = len(ys)
        with prof.record("Backward", "Model.l2") if detailed else nullspan():
            g_logits = [[(p - y) / n] for p, y in zip(probs, ys)]
            gw2, gb2, g_h = self.l2.backward(h, g_logits)
        with prof.record("Backward", "Model.l1") if detailed else nullspan():
            g_pre = [[g if v > 0 else 0.0 for g, v in zip(grow, vrow)] for grow, vrow in zip(g_h, h_pre)]
            gw1, gb1, _ = self.l1.backward(xs, g_pre)
        with prof.record("Optimizer", "SGD.step") if detailed else nullspan():
            self.l2.update(gw2, gb2, lr)
            self.l1.update(gw1, gb1, lr)
        return loss, correct


class nullspan:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def fetch(prof, it):
    """The next batch, as a DataLoaderIter event when the dataloader window is open."""
    if not prof.active("dataloader", "DataLoaderIter"):
        return next(it)
    start = prof.now_us()
    batch = next(it)
    prof.record_event("DataLoaderIter", "DataLoaderIter.__next__", start, prof.now_us())
    return batch


def main():
    steps = env_int("TRAIN_STEPS", 60)
    eval_every = max(1, env_int("EVAL_EVERY", 10))
    eval_steps = env_int("EVAL_STEPS", 3)
    batch = max(1, env_int("BATCH", 64))
    hidden = max(1, env_int("HIDDEN", 64))
    seed = env_int("SEED", 0)

    # Profiling problems never raise into this loop: when the library cannot be loaded or
    # the config turns profiling off, every call below does nothing.
    try:
        prof = trainprof.Profiler(framework="pytorch")
    except trainprof.LibraryError as e:
        print("trainprof: %s; training without profiling" % e, file=sys.stderr)
        prof = None
    if prof is None:
        return train(NoProfiler(), steps, eval_every, eval_steps, batch, hidden, seed)
    with prof:
        rc = train(prof, steps, eval_every, eval_steps, batch, hidden, seed)
    stats = prof.stats()  # after close: every event is in a sealed file or counted as dropped
    if stats["written"] or prof.dropped:
        print("profiled: %d timeline events written, %d dropped" % (stats["written"], prof.dropped))
    return rc


def train(prof, steps, eval_every, eval_steps, batch, hidden, seed):
    rng = random.Random(seed)
    model = Model(hidden, rng)
    train_data = Loader(batch, seed + 1)
    eval_data = Loader(batch, seed + 2)
    lr = 0.5
    t0 = time.monotonic()
    for _ in range(steps):
        step = prof.step_begin("train")
        xs, ys = fetch(prof, train_data)
        detailed = prof.active("detailed")
        loss, correct = model.train_step(prof, xs, ys, lr, detailed)
        prof.step_end()
        if (step + 1) % eval_every == 0:
            total, right = 0, 0
            for _ in range(eval_steps):
                prof.step_begin("eval")
                xs, ys = fetch(prof, eval_data)
                _, _, logits = model.forward(prof, xs, prof.active("detailed"))
                _, c, _ = model.loss(logits, ys)
                total += len(ys)
                right += c
                prof.step_end()
            print(
                "step %3d  loss %.3f  train acc %.2f  eval acc %.2f  (%.1f s)"
                % (step + 1, loss, correct / len(ys), right / max(1, total), time.monotonic() - t0),
                flush=True,
            )
    return 0


class NoProfiler:
    """What the loop calls when there is no library: nothing is recorded."""

    def __init__(self):
        self.steps = {}

    def step_begin(self, mode="train", step=None):
        n = self.steps.get(mode, 0)
        self.steps[mode] = n + 1
        return n

    def step_end(self):
        pass

    def forward_end(self):
        pass

    def active(self, feature, metrics_name=None, step=None):
        return False

    def record(self, phase, name, args=None, step=None):
        return nullspan()


if __name__ == "__main__":
    sys.exit(main())
