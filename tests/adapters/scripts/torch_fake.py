"""A training loop through trainprof.torch with objects that behave like torch's, for the
normal CI tier (no torch installed). Run in a subprocess by test_torch_adapter.py.

TRAINPROF_TEST_PARAMS (JSON):
  fake_profiler: install a fake ``torch`` / ``torch.profiler`` (default true); false leaves
                 torch absent, as it is in the CI venv
  cuda:          the fake torch has CUDA: every op also runs a kernel on device 0
  annotations:   with cuda: each op also has a device range of a record_function (gpu_user_annotation)
  cuda_version:  its ``torch.version.cuda`` (default "12.8"; null: a build without CUDA)
  start_fails:   the fake torch.profiler's start() raises (another profiler is running)
  user_profiler: after the loop the script makes a torch.profiler.profile of its own
  collectives:   after each backward op a gloo all-reduce of 1,089 floats as torch 2.15 records
                 it with record_shapes: ``c10d::allreduce_`` (a TensorList, its type not
                 written) on the calling thread, ``gloo:all_reduce`` (the tensor) on thread 3
  epochs, batches, eval_steps, predict_steps, num_workers, pin_memory
  attach_kwargs: keyword arguments of attach()
  plan:          [[mode, count], ...]: only these forwards (train / eval), then close
  separate_calls: the adapter makes the separate step calls, not trainprof_step_next
                 (the manifest's step_next_calls counts the one-call path's calls)
What the loop saw goes into the JSON manifest at TRAINPROF_TEST_MANIFEST.
"""

import itertools
import json
import os
import sys
import time
import types
import warnings

PARAMS = json.loads(os.environ.get("TRAINPROF_TEST_PARAMS") or "{}")
MANIFEST = os.environ["TRAINPROF_TEST_MANIFEST"]


# --- a fake torch: just what the adapter touches ------------------------------------------


class _DeviceType:
    def __init__(self, name):
        self.name = name

    def __repr__(self):
        return "DeviceType." + self.name


CPU, CUDA = _DeviceType("CPU"), _DeviceType("CUDA")


class _Interval:
    def __init__(self, start, end):
        self.start, self.end = start, end  # µs since the trace start, floats as torch's


class _FunctionEvent:
    """As torch 2.15's: ``id`` is an operator's own id, or for a runtime call and its kernel
    the one CUPTI correlation id they share; ``linked_correlation_id`` links both to the
    operator; ``device_resource_id`` is the stream of a kernel."""

    def __init__(self, id, name, thread, device_type, device_index, start, end, linked=0, stream=None):
        self.id, self.name, self.thread = id, name, thread
        self.device_type, self.device_index = device_type, device_index
        self.time_range = _Interval(start, end)
        self.linked_correlation_id = linked
        self.device_resource_id = thread if stream is None else stream
        self.is_user_annotation = False


class _FakeTorchProfile:
    running = None  # the profile that is started, if any
    starts = 0
    # TEARDOWN_CUPTI as each stop() saw it: Kineto reads it (getenv) when its trace ends
    # to decide whether CUPTI is finalized (detached) or stays attached.
    teardown_cupti_at_stop = []

    def __init__(self, activities):
        # What torch 2.4-2.10 says at every profile() without a schedule.
        warnings.warn(
            "Warning: Profiler clears events at the end of each cycle.Only events from the current cycle "
            "will be reported.To keep events across cycles, set acc_events=True.",
            UserWarning,
            stacklevel=2,
        )
        self.activities = list(activities)
        self._events = []
        self._ids = itertools.count(1)
        self.profiler = None

    def start(self):
        if PARAMS.get("start_fails"):
            raise RuntimeError("Profiler is already enabled on this thread")
        assert _FakeTorchProfile.running is None, "two profilers at once"
        self._t0_ns = time.time_ns()
        trace_start = self._t0_ns
        results = types.SimpleNamespace(trace_start_ns=lambda: trace_start)
        self.profiler = types.SimpleNamespace(kineto_results=results)
        _FakeTorchProfile.running = self
        _FakeTorchProfile.starts += 1

    def stop(self):
        assert _FakeTorchProfile.running is self
        _FakeTorchProfile.running = None
        _FakeTorchProfile.teardown_cupti_at_stop.append(os.environ.get("TEARDOWN_CUPTI"))

    def events(self):
        return list(self._events)

    def _rel_us(self):
        return (time.time_ns() - self._t0_ns) / 1000.0

    _corr = itertools.count(1)  # CUPTI's correlation ids: a sequence of their own (they alias op ids)

    def add_op(self, name, thread, body):
        start = self._rel_us()
        body()
        end = self._rel_us()
        op_id = next(self._ids)
        self._events.append(_FunctionEvent(op_id, name, thread, CPU, -1, start, end))
        if PARAMS.get("collectives") and name == "aten::mse_loss_backward":
            call = _FunctionEvent(next(self._ids), "c10d::allreduce_", thread, CPU, -1, end, end + 2.0)
            call.input_shapes = [[[1089]], [], [], [], [], []]
            call.input_dtypes = ["TensorList", "", "", "", "Scalar", "Scalar"]
            run = _FunctionEvent(next(self._ids), "gloo:all_reduce", 3, CPU, -1, end + 1.0, end + 5.0)
            run.input_shapes, run.input_dtypes = [[1089]], ["float"]
            self._events += [call, run]
        if "CUDA" in [a.name for a in self.activities]:
            corr = next(_FakeTorchProfile._corr)
            launch = start + (end - start) / 2
            self._events.append(
                _FunctionEvent(corr, "cudaLaunchKernel", thread, CPU, -1, launch, end, linked=op_id)
            )
            self._events.append(
                _FunctionEvent(corr, name + "_kernel", 7, CUDA, 0, end + 1.0, end + 3.5, linked=op_id, stream=7)
            )
            if PARAMS.get("annotations"):
                # A record_function range on the device (torch's gpu_user_annotation): an id of
                # its own, no launch call.
                a = _FunctionEvent(next(_FakeTorchProfile._corr), "Optimizer.step#SGD.step", 7, CUDA, 0, end, end + 3.5)
                a.is_user_annotation = True
                self._events.append(a)


def op(name, thread=1):
    """One operator (a few µs of work), seen by a running fake torch.profiler."""

    def body():
        sum(range(200))

    prof = _FakeTorchProfile.running
    if prof is None:
        body()
    else:
        prof.add_op(name, thread, body)


def install_fake_torch():
    torch = types.ModuleType("torch")
    profiler = types.ModuleType("torch.profiler")
    activity = types.SimpleNamespace(CPU=CPU, CUDA=CUDA)
    profiler.ProfilerActivity = activity
    profiler.profile = _FakeTorchProfile
    profiler.supported_activities = lambda: {CPU, CUDA}
    torch.profiler = profiler
    torch.cuda = types.SimpleNamespace(is_available=lambda: bool(PARAMS.get("cuda")))
    torch.version = types.SimpleNamespace(cuda=PARAMS.get("cuda_version", "12.8"))
    sys.modules["torch"] = torch
    sys.modules["torch.profiler"] = profiler


class _Handle:
    def __init__(self, hooks, key):
        self._hooks, self._key = hooks, key

    def remove(self):
        self._hooks.pop(self._key, None)


class Module:
    """Like torch.nn.Module: hooks around forward, named_modules, training."""

    _keys = itertools.count()

    def __init__(self, **children):
        self._pre, self._post = {}, {}
        self._children = children
        self.training = True

    def register_forward_pre_hook(self, hook):
        k = next(self._keys)
        self._pre[k] = hook
        return _Handle(self._pre, k)

    def register_forward_hook(self, hook):
        k = next(self._keys)
        self._post[k] = hook
        return _Handle(self._post, k)

    def named_modules(self, prefix=""):
        yield prefix, self
        for name, child in self._children.items():
            yield from child.named_modules(prefix + ("." if prefix else "") + name)

    def train(self, mode=True):
        for _, m in self.named_modules():
            m.training = mode
        return self

    def eval(self):
        return self.train(False)

    def hook_count(self):
        return sum(len(m._pre) + len(m._post) for _, m in self.named_modules())

    def __call__(self, x):
        for h in list(self._pre.values()):
            h(self, (x,))
        y = self.forward(x)
        for h in list(self._post.values()):
            h(self, (x,), y)
        return y


class Linear(Module):
    def forward(self, x):
        op("aten::linear")
        return x + 1


class ReLU(Module):
    def forward(self, x):
        op("aten::relu")
        return x


class Sequential(Module):
    def forward(self, x):
        for child in self._children.values():
            x = child(x)
        return x


class Net(Module):
    def __init__(self):
        super().__init__(fc1=Linear(), body=Sequential(**{"0": ReLU(), "1": Linear()}))

    def forward(self, x):
        return self._children["body"](self._children["fc1"](x))


class _MultiProcessingDataLoaderIter:
    """Forks ``num_workers`` worker processes that run the model and touch the hook (as a
    dataset that calls a model might): they must record nothing and exit cleanly."""

    def __init__(self, loader):
        self._batches = iter(range(loader.batches))
        self.worker_status = []
        for wid in range(loader.num_workers):
            pid = os.fork()
            if pid == 0:
                code = 0
                try:
                    loader.model(wid)
                    if HOOK is not None:
                        HOOK.close()
                except BaseException:
                    code = 3
                os._exit(code)
            self.worker_status.append(os.waitpid(pid, 0)[1])
        loader.worker_status.extend(self.worker_status)

    def __iter__(self):
        return self

    def __next__(self):
        time.sleep(0.0002)
        return next(self._batches)


class _SingleProcessDataLoaderIter(_MultiProcessingDataLoaderIter):
    pass


class Loader:
    def __init__(self, model, batches, num_workers, pin_memory):
        self.model, self.batches = model, batches
        self.num_workers, self.pin_memory = num_workers, pin_memory
        self.worker_status = []

    def __len__(self):
        return self.batches

    def __iter__(self):
        if self.num_workers:
            return _MultiProcessingDataLoaderIter(self)
        return _SingleProcessDataLoaderIter(self)


# --- the training loop --------------------------------------------------------------------

if PARAMS.get("fake_profiler", True):
    install_fake_torch()

import trainprof.torch  # noqa: E402

manifest = {"pid": os.getpid(), "steps": []}
model = Net()
HOOK = None
HOOK = trainprof.torch.attach(model, **PARAMS.get("attach_kwargs", {}))
# trainprof_step_next: counted, or (separate_calls) not used, so that a test can compare
# the one-call path with the separate calls.
manifest["step_next_calls"] = 0
if HOOK.profiler is not None and getattr(HOOK.profiler, "_c_step_next", None) is not None:
    if PARAMS.get("separate_calls"):
        HOOK.profiler._c_step_next = None
    else:
        _step_next = HOOK.profiler._c_step_next

        def _counted_step_next(*args):
            manifest["step_next_calls"] += 1
            return _step_next(*args)

        HOOK.profiler._c_step_next = _counted_step_next
manifest["hooks_after_attach"] = model.hook_count()
loader = Loader(model, PARAMS.get("batches", 4), PARAMS.get("num_workers", 2), PARAMS.get("pin_memory", True))
wrapped = trainprof.torch.profile_dataloader(loader)
manifest["len"] = len(wrapped)
manifest["num_workers_passthrough"] = wrapped.num_workers
manifest["max_hooks"] = 0


def run_plan(plan):
    """[[mode, count], ...]: ``count`` top-level forwards in ``model.train()`` or
    ``model.eval()`` each, no loader."""
    for mode, count in plan:
        model.train(mode == "train")
        for _ in range(count):
            model(0)
            manifest["steps"].append([mode, HOOK.step])
            manifest.setdefault("detailed", []).append(HOOK._detailed)
    HOOK.close()
    manifest["stats"] = HOOK.profiler.stats() if HOOK.profiler is not None else None
    with open(MANIFEST, "w") as f:
        json.dump(manifest, f)
    sys.exit(0)


if "plan" in PARAMS:
    run_plan(PARAMS["plan"])

model.train()
for epoch in range(PARAMS.get("epochs", 3)):
    for x in wrapped:
        model(x)
        op("aten::mse_loss_backward", thread=2)  # "backward", on the autograd thread
        manifest["steps"].append(["train", HOOK.step])
        manifest["max_hooks"] = max(manifest["max_hooks"], model.hook_count())
HOOK.set_mode("predict")
for _ in range(PARAMS.get("predict_steps", 1)):
    model(0)
    manifest["steps"].append(["predict", HOOK.step])
HOOK.set_mode(None)
model.eval()
for _ in range(PARAMS.get("eval_steps", 2)):
    model(0)
    manifest["steps"].append(["eval", HOOK.step])
manifest["hooks_before_close"] = model.hook_count()
HOOK.close()
HOOK.close()  # idempotent
model(0)  # after close: nothing happens
manifest["hooks_after_close"] = model.hook_count()
if PARAMS.get("user_profiler"):
    _FakeTorchProfile([CPU])  # the user's own profiler: its warning is theirs to see
manifest["profiler_starts"] = _FakeTorchProfile.starts
manifest["profiler_running_at_end"] = _FakeTorchProfile.running is not None
manifest["teardown_cupti_at_stop"] = _FakeTorchProfile.teardown_cupti_at_stop
manifest["worker_status"] = loader.worker_status
manifest["stats"] = HOOK.profiler.stats() if HOOK.profiler is not None else None
with open(MANIFEST, "w") as f:
    json.dump(manifest, f)
