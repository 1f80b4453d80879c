"""A plain-Python trainer through ``trainprof.torch`` without torch: a stand-in module with
two submodules (the hooks run as ``torch.nn.Module`` runs them) and a plain list as the data
loader, for the window caps tests (tests/hook/test_window_caps.py; docs/formats.md, "Window
caps").

TRAINPROF_TEST_PARAMS (JSON): ``steps`` (batches, one step each). Op events are off (no
torch.profiler), so the detailed window writes the ``Forward`` events: three a step.
"""

import json
import os

import trainprof.torch

PARAMS = json.loads(os.environ.get("TRAINPROF_TEST_PARAMS") or "{}")
MANIFEST = os.environ["TRAINPROF_TEST_MANIFEST"]


class Handle:
    def __init__(self, hooks, fn):
        self._hooks, self._fn = hooks, fn

    def remove(self):
        if self._fn in self._hooks:
            self._hooks.remove(self._fn)


class Module:
    """Runs forward pre-hooks, ``forward`` and forward hooks as ``torch.nn.Module`` does."""

    training = True

    def __init__(self, children=()):
        self._pre, self._post, self._children = [], [], list(children)

    def register_forward_pre_hook(self, fn):
        self._pre.append(fn)
        return Handle(self._pre, fn)

    def register_forward_hook(self, fn):
        self._post.append(fn)
        return Handle(self._post, fn)

    def named_modules(self):
        yield "", self
        for i, c in enumerate(self._children):
            yield "layer%d" % i, c

    def __call__(self, x):
        for h in list(self._pre):
            h(self, (x,))
        out = self.forward(x)
        for h in list(self._post):
            h(self, (x,), out)
        return out

    def forward(self, x):
        for c in self._children:
            x = c(x)
        return x + 1


class Net(Module):
    pass


model = Net([Module(), Module()])
hook = trainprof.torch.attach(model, op_events=False)
loader = trainprof.torch.profile_dataloader(list(range(PARAMS.get("steps", 10))))
caps = hook.profiler.window_caps()
for batch in loader:
    model(batch)
hook.close()
with open(MANIFEST, "w") as f:
    json.dump({"caps": caps, "stats": hook.profiler.stats()}, f)
