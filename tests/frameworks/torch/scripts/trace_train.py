"""A small CPU model under a detailed window, then the same steps under plain torch.profiler,
for tests/frameworks/torch/test_torch_trace.py (docs/formats.md, "Detailed windows through
torch's own trace").

TRAINPROF_TEST_PARAMS (JSON): ``python_conversion`` (the adapter's fallback: torch's results
read in Python), ``plant_link`` (a link to another trace planted where torch wrote the
window's). Each step is forward, backward, optimiser step, zero_grad, so that a window (from
the forward pre-hook of its first step to that of the step after it) holds whole steps. The
manifest (TRAINPROF_TEST_MANIFEST) has the op counts of plain torch.profiler over the same
number of steps, by torch's own filter and names (``_filter_name``, ``_rewrite_name``).
"""

import collections
import json
import os

import torch
from torch.autograd.profiler_util import _filter_name, _rewrite_name
from torch.profiler import ProfilerActivity, profile

import trainprof.torch

PARAMS = json.loads(os.environ.get("TRAINPROF_TEST_PARAMS") or "{}")
MANIFEST = os.environ["TRAINPROF_TEST_MANIFEST"]
WINDOW = 3  # the config's NumSteps

if PARAMS.get("python_conversion"):
    trainprof.torch.TorchHook._hand_over_trace = lambda *a: False

planted = {}
if PARAMS.get("plant_link"):
    from trainprof._profiler import Profiler

    create, hand_back = Profiler._torch_trace_create, Profiler._torch_trace_import

    def _create(self):
        made = create(self)
        planted["path"] = made[1] if made else None
        return made

    def _import(self, token, *args):
        # What a trainer could do between torch's export and the hand-back: the file swapped
        # for a link to a trace of its own.
        decoy = os.path.join(os.path.dirname(MANIFEST), "decoy.json")
        with open(decoy, "w") as f:
            json.dump({"traceEvents": [{"ph": "X", "cat": "cpu_op", "name": "planted::op", "ts": 1, "dur": 1}]}, f)
        os.unlink(planted["path"])
        os.symlink(decoy, planted["path"])
        return hand_back(self, token, *args)

    Profiler._torch_trace_create, Profiler._torch_trace_import = _create, _import

torch.manual_seed(0)
torch.set_num_threads(1)
model = torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
x = torch.randn(8, 16)


def step():
    loss = model(x).sum()
    loss.backward()
    opt.step()
    opt.zero_grad()


hook = trainprof.torch.attach(model)
for _ in range(8):
    step()
hook.close()

# The same number of steps under plain torch.profiler.
tp = profile(activities=[ProfilerActivity.CPU])
tp.start()
for _ in range(WINDOW):
    step()
tp.stop()
ops = collections.Counter(
    _rewrite_name(e.name(), with_wildcard=True)
    for e in tp.profiler.kineto_results.events()
    if not _filter_name(e.name()) and not e.is_hidden_event()
)
with open(MANIFEST, "w") as f:
    json.dump({"plain_ops": ops, "planted": planted, "stats": hook.profiler.stats()}, f)
