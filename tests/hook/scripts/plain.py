"""A plain training script that uses every entry point of the trainprof package, for the
kill-switch tests: run with profiling off (TRAINPROF_DISABLE, no loadable library) it
must print its own lines unchanged and exit 0. TRAINPROF_TEST_PARAMS: ``{"strict": true}``
makes the Profiler strict."""

import json
import os

import trainprof
import trainprof.keras
import trainprof.torch

PARAMS = json.loads(os.environ.get("TRAINPROF_TEST_PARAMS") or "{}")


class Module:
    """What trainprof.torch.attach needs of a torch.nn.Module: forward hooks."""

    def __init__(self):
        self.pre, self.post = [], []

    def register_forward_pre_hook(self, fn):
        self.pre.append(fn)
        return self

    def register_forward_hook(self, fn):
        self.post.append(fn)
        return self

    def remove(self):
        pass

    def named_modules(self):
        return [("", self)]

    def __call__(self, x):
        for fn in self.pre:
            fn(self, (x,))
        y = x * 2
        for fn in self.post:
            fn(self, (x,), y)
        return y


class Loader:
    num_workers = 0
    pin_memory = False

    def __iter__(self):
        return iter(range(3))


with trainprof.Profiler(framework="pytorch", strict=PARAMS.get("strict", False)) as prof:
    total = 0
    for step in range(3):
        n = prof.step_begin("train")
        with prof.record("Forward", "Net", args={"i": step}):
            total += step
        prof.record_event("Forward", "Explicit", prof.now_us(), prof.now_us(), step=n)
        prof.forward_end()
        for feature in ("detailed", "python", "smdataparallel"):
            assert prof.active(feature) is False
        assert prof.active("dataloader", "DataLoaderIter::GetNext") is False
        prof.step_end()
        print("step", n, "total", total, flush=True)
    assert prof.enabled is False
    print("stats", json.dumps(prof.stats()), "dropped", prof.dropped, "node", prof.node_id, flush=True)

model = Module()
hook = trainprof.torch.attach(model)
for batch in trainprof.torch.profile_dataloader(Loader()):
    model(batch)
hook.close()

callback = trainprof.keras.callback_class(object)()
callback.on_train_batch_begin(0)
callback.on_train_batch_end(0)
callback.on_test_batch_begin(0)
callback.on_test_batch_end(0)
callback.on_train_end()
callback.close()
print("done", flush=True)
