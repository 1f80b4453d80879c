"""A small CPU model under a detailed window with torch.profiler's ``profile_memory``, for
tests/frameworks/torch/test_torch_memory_events.py (docs/formats.md, "Memory events").

In global step 3 (inside the window of steps 2-4) three 16 MiB tensors are held at once, then
freed; the manifest (TRAINPROF_TEST_MANIFEST) has the epoch times just before the first of them
was allocated and just after the last was freed."""

import json
import os
import time

import torch

import trainprof.torch

MANIFEST = os.environ["TRAINPROF_TEST_MANIFEST"]
PLANTED_STEP = 3
PLANTED = 3
MIB = 1 << 20

torch.manual_seed(0)
torch.set_num_threads(1)
model = torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
x = torch.randn(8, 16)
planted = {}

hook = trainprof.torch.attach(model, profiler_options={"profile_memory": True})
for step in range(8):
    loss = model(x).sum()
    loss.backward()
    opt.step()
    opt.zero_grad()
    if step == PLANTED_STEP:
        planted["before_s"] = time.time()
        held = [torch.ones(16 * MIB, dtype=torch.uint8) for _ in range(PLANTED)]
        del held
        planted["after_s"] = time.time()
hook.close()
with open(MANIFEST, "w") as f:
    json.dump({"planted": planted, "bytes": PLANTED * 16 * MIB, "stats": hook.profiler.stats()}, f)
