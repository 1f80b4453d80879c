"""The same kind of training loop in PyTorch, profiled with the trainprof.torch adapter.

    trainprof run -- python3 examples/train_torch.py
    SMPROFILER_CONFIG_PATH=examples/profilerconfig.json \\
        trainprof run --s3 '' -- python3 examples/train_torch.py     # every window opens

Needs PyTorch (any recent version; CPU is enough, a CUDA device is used when there is one).
A small convolutional network learns a synthetic image problem from a DataLoader with two
worker processes, with an evaluation pass every EVAL_EVERY steps. The adapter adds, with
the two lines marked below:

* one step per top-level forward (``Step:ModeKeys.TRAIN`` / ``EVAL`` events);
* in the detailed-profiling window, ``Forward`` / ``Forward-SubModuleInternal`` events and
  ``torch.profiler``'s ops (``cpu_functions``) and, on a GPU, kernels (``gpu_functions-dev:N``);
* in the dataloader window, ``DataLoaderIterInitialize`` and ``DataLoaderIter::GetNext`` events;
* in the Python-profiling window, cProfile or pyinstrument stats per step.

Settings from the environment: TRAIN_STEPS (default 40), EVAL_EVERY (10), EVAL_STEPS (3),
BATCH (32), WORKERS (2), SEED (0).
"""

import os
import sys
import time

try:
    import torch
    from torch import nn
    from torch.utils.data import DataLoader, Dataset
except ImportError:
    sys.exit("examples/train_torch.py needs PyTorch (pip install torch); examples/train.py needs only Python")

try:
    import trainprof.torch
except ImportError:  # run from a checkout: the package lives in hook-ffi/python
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "hook-ffi", "python"))
    import trainprof.torch


def env_int(name, default):
    try:
        return int(os.environ.get(name, default))
    except ValueError:
        sys.exit("%s must be an integer, not %r" % (name, os.environ[name]))


class Shapes(Dataset):
    """16x16 single-channel images: a bright square (label 1) or a bright bar (label 0),
    at a random place, in noise. Generated per index, so workers need no shared state."""

    def __init__(self, n, seed):
        self.n = n
        self.seed = seed

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + i)
        img = torch.randn(1, 16, 16, generator=g) * 0.3
        label = int(torch.randint(0, 2, (1,), generator=g))
        r, c = (int(v) for v in torch.randint(0, 11, (2,), generator=g))
        if label:
            img[0, r:r + 5, c:c + 5] += 1.0
        else:
            img[0, r:r + 1, :] += 1.0
        return img, label


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(1, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        )
        self.head = nn.Sequential(nn.Flatten(), nn.Linear(32 * 4 * 4, 64), nn.ReLU(), nn.Linear(64, 2))

    def forward(self, x):
        return self.head(self.features(x))


def main():
    steps = env_int("TRAIN_STEPS", 40)
    eval_every = max(1, env_int("EVAL_EVERY", 10))
    eval_steps = env_int("EVAL_STEPS", 3)
    batch = max(1, env_int("BATCH", 32))
    workers = max(0, env_int("WORKERS", 2))
    torch.manual_seed(env_int("SEED", 0))
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")

    model = Net().to(device)
    hook = trainprof.torch.attach(model)  # trainprof: steps and the detailed window
    train_data = DataLoader(Shapes(steps * batch, 1), batch_size=batch, shuffle=True, num_workers=workers)
    train_data = trainprof.torch.profile_dataloader(train_data)  # trainprof: the dataloader window
    eval_data = DataLoader(Shapes(eval_steps * batch, 2), batch_size=batch, num_workers=0)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    loss_fn = nn.CrossEntropyLoss()

    t0 = time.monotonic()
    for step, (x, y) in enumerate(train_data, 1):
        model.train()
        x, y = x.to(device), y.to(device)
        loss = loss_fn(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        if step % eval_every == 0:
            model.eval()
            right = total = 0
            with torch.no_grad():
                for ex, ey in eval_data:
                    pred = model(ex.to(device)).argmax(1).cpu()
                    right += int((pred == ey).sum())
                    total += len(ey)
            print("step %3d  loss %.3f  eval acc %.2f  (%.1f s, %s)"
                  % (step, loss.item(), right / max(1, total), time.monotonic() - t0, device), flush=True)
    hook.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
