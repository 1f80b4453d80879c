"""A small real PyTorch training run through trainprof.torch, run in a subprocess by
test_torch_real.py: a tiny CNN, a DataLoader with worker processes, a few train epochs and
an eval pass. TRAINPROF_TEST_PARAMS (JSON) says how many; what the run saw goes into the
JSON manifest at TRAINPROF_TEST_MANIFEST."""

import json
import os
import time

import torch
from net import Net
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import trainprof.torch

PARAMS = json.loads(os.environ.get("TRAINPROF_TEST_PARAMS") or "{}")
MANIFEST = os.environ["TRAINPROF_TEST_MANIFEST"]
EPOCHS = PARAMS.get("epochs", 3)
BATCHES = PARAMS.get("batches", 4)  # per epoch
EVAL_BATCHES = PARAMS.get("eval_batches", 2)
WORKERS = PARAMS.get("num_workers", 2)
DEVICE = PARAMS.get("device") or ("cuda" if torch.cuda.is_available() else "cpu")

torch.manual_seed(0)
n = BATCHES * 8
data = TensorDataset(torch.randn(n, 1, 8, 8), torch.randint(0, 10, (n,)))
loader = DataLoader(data, batch_size=8, num_workers=WORKERS, pin_memory=False)
model = Net().to(DEVICE)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
loss_fn = nn.CrossEntropyLoss()

hook = trainprof.torch.attach(model)
loader = trainprof.torch.profile_dataloader(loader)

manifest = {"pid": os.getpid(), "device": DEVICE, "steps": [], "torch": torch.__version__}
t_start = time.perf_counter()
model.train()
for epoch in range(EPOCHS):
    for x, y in loader:
        x, y = x.to(DEVICE), y.to(DEVICE)
        opt.zero_grad()
        loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()
        manifest["steps"].append(["train", hook.step])
model.eval()
with torch.no_grad():
    for i, (x, y) in enumerate(loader):
        if i >= EVAL_BATCHES:
            break
        model(x.to(DEVICE))
        manifest["steps"].append(["eval", hook.step])
if DEVICE == "cuda":
    torch.cuda.synchronize()
hook.close()
manifest["seconds"] = time.perf_counter() - t_start
manifest["stats"] = hook.profiler.stats()
manifest["node_id"] = hook.profiler.node_id
with open(MANIFEST, "w") as f:
    json.dump(manifest, f)
