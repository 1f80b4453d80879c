"""Top-level forwards in a planned order of modes through trainprof.torch, or through
smdebug 1.0.34's own PyTorch hook (the oracle), run in a subprocess by test_torch_real.py.

TRAINPROF_TEST_PARAMS (JSON):
  plan:     [[mode, count], ...]: ``count`` steps in ``model.train()`` / ``model.eval()``
            (train steps also run backward and an optimizer step)
  hook:     "trainprof" (default) or "smdebug"
  compile:  null, "outer" (attach to ``torch.compile(model)``) or "inner" (attach to the
            model, then compile it)
What the run saw goes into the JSON manifest at TRAINPROF_TEST_MANIFEST.
"""

import json
import os

import torch
from net import Net
from torch import nn

PARAMS = json.loads(os.environ.get("TRAINPROF_TEST_PARAMS") or "{}")
MANIFEST = os.environ["TRAINPROF_TEST_MANIFEST"]
PLAN = PARAMS.get("plan", [["train", 10], ["eval", 2], ["train", 2]])
COMPILE = PARAMS.get("compile")

torch.manual_seed(0)
net = Net()
opt = torch.optim.SGD(net.parameters(), lr=0.01)
loss_fn = nn.CrossEntropyLoss()
x, y = torch.randn(8, 1, 8, 8), torch.randint(0, 10, (8,))

if PARAMS.get("hook") == "smdebug":
    import smdebug.pytorch as smd

    hook = smd.Hook(out_dir=os.path.join(os.getcwd(), "smdebug-tensors"), export_tensorboard=False)
    hook.register_module(net)
    model = net
    set_mode = lambda mode: hook.set_mode(smd.modes.TRAIN if mode == "train" else smd.modes.EVAL)  # noqa: E731
else:
    import trainprof.torch

    if COMPILE == "outer":
        model = torch.compile(net)
        hook = trainprof.torch.attach(model)
    else:
        hook = trainprof.torch.attach(net)
        model = torch.compile(net) if COMPILE == "inner" else net
    set_mode = lambda mode: None  # noqa: E731  (from model.training)

manifest = {"pid": os.getpid(), "steps": [], "torch": torch.__version__}
for mode, count in PLAN:
    set_mode(mode)
    net.train(mode == "train")
    for _ in range(count):
        if mode == "train":
            opt.zero_grad()
            loss_fn(model(x), y).backward()
            opt.step()
        else:
            with torch.no_grad():
                model(x)
        manifest["steps"].append([mode, hook.step])
hook.close()
if PARAMS.get("hook") != "smdebug":
    manifest["stats"] = hook.profiler.stats()
with open(MANIFEST, "w") as f:
    json.dump(manifest, f)
