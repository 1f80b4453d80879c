"""A real GPU training loop for measuring trainprof on a GPU machine (run by scripts/gpu-check):
torchvision ResNet-50 from scratch (no weights), bf16 autocast, channels_last, SGD, a DataLoader
of synthetic uint8 images (nothing is downloaded), ``torch.cuda.synchronize()`` at the end of
each step so that a step's wall time is its GPU time too.

    python3 bench/gpu_train.py --seconds 25 --steps-out steps.txt [--tp] [--slow-step 330]

--tp       attach the trainprof adapter (trainprof.torch.attach, profile_dataloader): the
           windows are whatever the config in use (SMPROFILER_CONFIG_PATH) asks for.
--slow-step N   sleeps 0.6 s inside step N (a planted slow step for AutoProfilingConfig).

Writes the seconds of every step, one a line, to --steps-out, and prints one line: the steps,
the median (after the first 50), the loss. Exits 3 with one line when torch, torchvision or a
CUDA device is missing.
"""

import argparse
import os
import sys
import time


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=25.0)
    ap.add_argument("--batch", type=int, default=int(os.environ.get("GPU_CHECK_BATCH", "128")))
    ap.add_argument("--workers", type=int, default=6)
    ap.add_argument("--slow-step", type=int, default=-1)
    ap.add_argument("--steps-out")
    ap.add_argument("--tp", action="store_true")
    a = ap.parse_args()
    try:
        import torch
        import torchvision
        from torch import nn
        from torch.utils.data import DataLoader, Dataset
    except ImportError as e:
        print("gpu_train: no torch/torchvision here (%s)" % e, flush=True)
        return 3
    if not torch.cuda.is_available():
        print("gpu_train: torch sees no CUDA device", flush=True)
        return 3

    class Synth(Dataset):
        """Random images (a fixed seed per index) and labels: the workers' decode-like CPU work."""

        def __init__(self, n, size):
            self.n, self.size = n, size

        def __len__(self):
            return self.n

        def __getitem__(self, i):
            g = torch.Generator().manual_seed(i)
            img = torch.randint(0, 256, (3, self.size, self.size), dtype=torch.uint8, generator=g)
            if i % 2:
                img = img.flip(2)
            return img, i % 1000

    dev = torch.device("cuda")
    torch.backends.cudnn.benchmark = True
    model = torchvision.models.resnet50().to(dev).to(memory_format=torch.channels_last)
    hook = None
    loader = DataLoader(Synth(10**7, 224), batch_size=a.batch, num_workers=a.workers, pin_memory=True,
                        persistent_workers=a.workers > 0, prefetch_factor=4 if a.workers > 0 else None)
    if a.tp:
        import trainprof.torch

        hook = trainprof.torch.attach(model)
        loader = trainprof.torch.profile_dataloader(loader)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    loss_fn = nn.CrossEntropyLoss()
    mean = torch.tensor([0.485, 0.456, 0.406], device=dev).view(1, 3, 1, 1) * 255
    std = torch.tensor([0.229, 0.224, 0.225], device=dev).view(1, 3, 1, 1) * 255
    times = []
    t_start = time.monotonic()
    it = iter(loader)
    step = 0
    loss = None
    while time.monotonic() - t_start < a.seconds:
        t0 = time.perf_counter()
        x, y = next(it)
        x = x.to(dev, non_blocking=True).float().sub_(mean).div_(std).contiguous(memory_format=torch.channels_last)
        y = y.to(dev, non_blocking=True)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = loss_fn(model(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        if step == a.slow_step:
            time.sleep(0.6)
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
        step += 1
    if hook is not None:
        hook.close()
    if a.steps_out:
        with open(a.steps_out, "w") as f:
            f.write("".join("%.6f\n" % t for t in times))
    srt = sorted(times[50:]) or sorted(times)
    print("gpu_train: steps %d  median %.2f ms  loss %.3f  trainprof=%s"
          % (len(times), 1e3 * srt[len(srt) // 2], loss.item() if loss is not None else float("nan"), a.tp),
          flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
