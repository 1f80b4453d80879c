"""Many small ops a step under a detailed window with ``with_stack`` and ``record_shapes``,
for the window caps test (tests/frameworks/torch/test_torch_caps.py; docs/formats.md, "Window
caps"): torch.profiler's buffers grow with every op, so a long window would grow the trainer
without bound; its cap stops it.

TRAINPROF_TEST_PARAMS (JSON): ``steps``, ``ops`` (small ops a forward). The manifest
(TRAINPROF_TEST_MANIFEST) has the resident memory just before the window opens and the
trainer's peak resident memory (``ru_maxrss``) at the end, in bytes.
"""

import json
import os
import resource

import torch

import trainprof.torch
from trainprof._caps import rss_bytes

PARAMS = json.loads(os.environ.get("TRAINPROF_TEST_PARAMS") or "{}")
MANIFEST = os.environ["TRAINPROF_TEST_MANIFEST"]


class Many(torch.nn.Module):
    def __init__(self, ops):
        super().__init__()
        self.ops = ops

    def forward(self, x):
        for _ in range(self.ops):
            x = x * 1.0001 + 0.5
        return x


model = Many(PARAMS.get("ops", 2000))
hook = trainprof.torch.attach(model, profiler_options={"with_stack": True, "record_shapes": True})
x = torch.ones(8)
before = None
for step in range(PARAMS.get("steps", 40)):
    if step == 2:  # the window opens at step 2's pre-hook: measured just before it
        before = {"rss": rss_bytes(), "peak": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}
    model(x)
hook.close()
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
with open(MANIFEST, "w") as f:
    json.dump({"before": before, "peak": peak, "stats": hook.profiler.stats()}, f)
