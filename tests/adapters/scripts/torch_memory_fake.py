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
  cuda:             torch.cuda.is_available() (default true)
  stop:             a path: steps go on (at most ``steps``) until that file appears, one
                    every ``step_ms`` (default 20), for `trainprof trigger` (test_torch_memory_trigger.py);
                    the manifest is written at each step (its ``step``: the step reached)
  ranks:            starts this many ranks (``RANK`` set), each writing the manifest
                    ``<TRAINPROF_TEST_MANIFEST>.<rank>``, and waits for them all
What the CUDA calls were goes into the JSON manifest at TRAINPROF_TEST_MANIFEST, written
before the loop ends (also when the OOM ends the process), with ``memory_questions``: how
often the package asked the library whether the memory window is open, and (after
``attach``) for the memory settings (``settings_asked``).
"""

import json
import os
import subprocess
import sys
import time
import types

PARAMS = json.loads(os.environ.get("TRAINPROF_TEST_PARAMS") or "{}")
MANIFEST = os.environ["TRAINPROF_TEST_MANIFEST"]
if "ranks" in PARAMS:
    if "RANK" not in os.environ:
        procs = [
            subprocess.Popen([sys.executable, os.path.abspath(__file__)], env=dict(os.environ, RANK=str(rank)))
            for rank in range(int(PARAMS["ranks"]))
        ]
        sys.exit(max(p.wait() for p in procs))
    MANIFEST = "%s.%s" % (MANIFEST, os.environ["RANK"])
CALLS = []  # ("record", max_entries, stacks) | ("stop",) | ("snapshot", step) | ("observe",)
STATE = {"step": -1, "recording": False, "observers": [], "memory_questions": 0, "settings_asked": 0}


def save():
    with open(MANIFEST, "w") as f:
        json.dump(dict({k: STATE[k] for k in ("memory_questions", "settings_asked", "step")}, calls=CALLS), f)


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
    cuda.is_available = lambda: bool(PARAMS.get("cuda", True))
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

        from trainprof import _lib

        kwargs = {"cuda_memory": StandIn()} if PARAMS.get("stand_in") else {}
        hook = trainprof.torch.attach(model, **kwargs)
        if hook.profiler is not None:
            # Count the package's questions about the memory window (its one call into the library).
            asks = hook.profiler._window_active

            def counting(feature, *args):
                if feature == _lib.FEATURE_MEMORY:
                    STATE["memory_questions"] += 1
                return asks(feature, *args)

            hook.profiler._window_active = counting
            settings = hook.profiler._memory_settings

            def counting_settings(*args, **kwargs):
                STATE["settings_asked"] += 1
                return settings(*args, **kwargs)

            hook.profiler._memory_settings = counting_settings
    save()
    stop = PARAMS.get("stop")
    for step in range(PARAMS.get("steps", 8)):
        if stop is not None:
            if os.path.exists(stop):
                break
            time.sleep(PARAMS.get("step_ms", 20) / 1000.0)
        STATE["step"] = step
        if stop is not None:
            save()  # the step reached, for the test to wait on
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
