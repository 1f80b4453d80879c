"""A training loop through trainprof.torch with a fake torch whose CUDA memory calls are
recorded (no GPU, no torch installed), for the memory-snapshot tests. Run in a subprocess
by test_torch_memory.py.

TRAINPROF_TEST_PARAMS (JSON):
  steps:            forwards to run (default 8)
  oom_at:           the forward of this global step raises torch.OutOfMemoryError
  observer:         the fake torch has torch._C._cuda_attach_out_of_memory_observer (default true)
  observer_repeats: how often the fake allocator calls the observers for one OOM (default 3)
  catch_oom:        the loop catches the OOM, prints "caught", and goes on
  plain:            no trainprof at all (the same loop, for comparison)
  stand_in:         attach(cuda_memory=<a stand-in object>) instead of the fake torch's calls
What the CUDA calls were goes into the JSON manifest at TRAINPROF_TEST_MANIFEST, written
before the loop ends (also when the OOM ends the process).
"""

import json
import os
import sys
import types

PARAMS = json.loads(os.environ.get("TRAINPROF_TEST_PARAMS") or "{}")
MANIFEST = os.environ["TRAINPROF_TEST_MANIFEST"]
CALLS = []  # ("record", max_entries, stacks) | ("stop",) | ("snapshot", step) | ("observe",)
STATE = {"step": -1, "recording": False, "observers": []}


def save():
    with open(MANIFEST, "w") as f:
        json.dump({"calls": CALLS}, f)


class OutOfMemoryError(RuntimeError):
    pass


def _record_memory_history(enabled="all", context="all", stacks="all", max_entries=sys.maxsize):
    if enabled is None:
        CALLS.append(["stop"])
        STATE["recording"] = False
    else:
        assert (enabled, context) == ("all", "all"), (enabled, context)
        CALLS.append(["record", max_entries, stacks])
        STATE["recording"] = True
    save()


def _snapshot():
    CALLS.append(["snapshot", STATE["step"], STATE["recording"]])
    save()
    frame = {"filename": "train.py", "line": 10 + STATE["step"], "name": "forward"}
    return {
        "segments": [{"device": 0, "total_size": 2 << 20, "blocks": []}],
        "device_traces": [[{"action": "alloc", "addr": 4096, "size": 512, "time_us": 1, "frames": [frame]}]],
    }


def install_fake_torch():
    torch = types.ModuleType("torch")
    torch.OutOfMemoryError = OutOfMemoryError
    cuda = types.ModuleType("torch.cuda")
    cuda.is_available = lambda: True
    cuda.OutOfMemoryError = OutOfMemoryError
    memory = types.ModuleType("torch.cuda.memory")
    memory._record_memory_history = _record_memory_history
    memory._snapshot = _snapshot
    cuda.memory = memory
    torch.cuda = cuda
    c = types.ModuleType("torch._C")
    if PARAMS.get("observer", True):

        def attach(fn):
            CALLS.append(["observe"])
            STATE["observers"].append(fn)

        c._cuda_attach_out_of_memory_observer = attach
    torch._C = c
    sys.modules.update({"torch": torch, "torch.cuda": cuda, "torch.cuda.memory": memory, "torch._C": c})


class StandIn:
    """What attach(cuda_memory=...) takes: the same methods as trainprof._memory.CudaMemory."""

    def available(self):
        return True

    def record(self, max_entries, stacks):
        _record_memory_history("all", context="all", stacks=stacks, max_entries=max_entries)

    def stop(self):
        _record_memory_history(None)

    def snapshot(self):
        return _snapshot()

    def attach_oom_observer(self, fn):
        return False

    def is_oom(self, exc):
        return isinstance(exc, OutOfMemoryError)


class _Handle:
    def __init__(self, d, k):
        self.d, self.k = d, k

    def remove(self):
        self.d.pop(self.k, None)


class Net:
    """Like torch.nn.Module's call: pre-hooks, forward, hooks; an always_call hook also runs
    when forward raises (inside the except block), then the error goes on."""

    training = True

    def __init__(self):
        self._pre, self._post, self._always, self._n = {}, {}, set(), 0

    def register_forward_pre_hook(self, hook):
        self._n += 1
        self._pre[self._n] = hook
        return _Handle(self._pre, self._n)

    def register_forward_hook(self, hook, always_call=False):
        self._n += 1
        self._post[self._n] = hook
        if always_call:
            self._always.add(self._n)
        return _Handle(self._post, self._n)

    def named_modules(self):
        return [("", self)]

    def forward(self, x):
        if STATE["step"] == PARAMS.get("oom_at"):
            for _ in range(PARAMS.get("observer_repeats", 3)):
                for fn in list(STATE["observers"]):
                    fn(0, 1 << 30, 1 << 20, 0)
            raise OutOfMemoryError("CUDA out of memory. Tried to allocate 1.00 GiB")
        return x + 1

    def __call__(self, x):
        for h in list(self._pre.values()):
            h(self, (x,))
        try:
            y = self.forward(x)
        except Exception:
            for k, h in list(self._post.items()):
                if k in self._always:
                    try:
                        h(self, (x,), None)
                    except Exception:
                        pass
            raise
        for h in list(self._post.values()):
            h(self, (x,), y)
        return y


def main():
    install_fake_torch()
    model = Net()
    hook = None
    if not PARAMS.get("plain"):
        import trainprof.torch

        kwargs = {"cuda_memory": StandIn()} if PARAMS.get("stand_in") else {}
        hook = trainprof.torch.attach(model, **kwargs)
    save()
    for step in range(PARAMS.get("steps", 8)):
        STATE["step"] = step
        try:
            model(step)
        except OutOfMemoryError:
            if not PARAMS.get("catch_oom"):
                raise
            print("caught", flush=True)
    if hook is not None:
        hook.close()
    save()


if __name__ == "__main__":
    main()
