"""The ranks of one "node" of a small DDP job for test_torch_trigger.py (`trainprof
trigger` across nodes): a two-layer model in DistributedDataParallel over gloo, attached with
``trainprof.torch.attach``, stepping until the file ``stop`` appears (every rank stops at the
same step: the flag is all-reduced each step).

Without ``RANK`` it is the node's launcher: it starts ``ranks_per_node`` ranks
(``RANK = node_index × ranks_per_node + i``) and exits with the highest exit status.

With ``steps`` it runs exactly that many steps instead (no stop flag, so the only
collectives are DDP's gradient all-reduces), and the rank ``late_rank`` sleeps ``late_ms``
before each forward: it arrives last at every one of them.

TRAINPROF_TEST_PARAMS: ``{"store": path (gloo's file store, shared by every node),
"stop": path, "node_index": int, "ranks_per_node": int, "world": int, "step_ms": float,
"max_steps": int, "steps": int, "late_rank": int, "late_ms": float, "record_shapes": bool (the
detailed window's torch.profiler records the ops' input shapes)}``."""

import datetime
import json
import os
import subprocess
import sys
import time

PARAMS = json.loads(os.environ["TRAINPROF_TEST_PARAMS"])

if "RANK" not in os.environ:
    per_node = int(PARAMS.get("ranks_per_node", 2))
    base = int(PARAMS["node_index"]) * per_node
    procs = [subprocess.Popen([sys.executable, os.path.abspath(__file__)],
                              env=dict(os.environ, RANK=str(base + i), LOCAL_RANK=str(i)))
             for i in range(per_node)]
    sys.exit(max(p.wait() for p in procs))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from torch import nn  # noqa: E402

import trainprof.torch  # noqa: E402

RANK = int(os.environ["RANK"])
torch.manual_seed(0)
torch.set_num_threads(1)
dist.init_process_group("gloo", init_method="file://" + PARAMS["store"], rank=RANK,
                        world_size=int(PARAMS["world"]), timeout=datetime.timedelta(seconds=120))
model = nn.parallel.DistributedDataParallel(nn.Sequential(nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 1)))
hook = trainprof.torch.attach(model, profiler_options={"record_shapes": True} if PARAMS.get("record_shapes") else None)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
x, y = torch.randn(16, 32), torch.randn(16, 1)
step_s = float(PARAMS.get("step_ms", 20)) / 1000.0
late_s = float(PARAMS.get("late_ms", 0)) / 1000.0 if PARAMS.get("late_rank") == RANK else 0.0
fixed = PARAMS.get("steps")
steps = 0
for steps in range(int(fixed if fixed is not None else PARAMS.get("max_steps", 20000))):
    if fixed is None:
        flag = torch.tensor([1.0 if os.path.exists(PARAMS["stop"]) else 0.0])
        dist.all_reduce(flag)
        if flag.item() > 0:
            break
    if late_s:
        time.sleep(late_s)
    opt.zero_grad()
    loss = ((model(x) - y) ** 2).mean()
    loss.backward()
    opt.step()
    time.sleep(step_s)
hook.close()
dist.destroy_process_group()
print("rank %d done after %d steps" % (RANK, steps), flush=True)
