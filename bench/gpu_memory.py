"""A ResNet job with a planted leak, then a planted out-of-memory error, for scripts/gpu-check's
`memory` part (docs/formats.md, "Memory windows"; docs/report.md, "Snapshot keys"):
torchvision's ResNet-18 on random images, ``trainprof.torch`` attached. Every step keeps one
8 MiB tensor alive in a list (the leak: the line marked below), and at ``--oom-step`` it asks
for more memory than the GPU has, which raises ``torch.OutOfMemoryError`` out of the script
(its exit status is Python's for an uncaught exception, 1).

    python3 bench/gpu_memory.py --steps 40 --oom-step 30
"""

import argparse


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--oom-step", type=int, default=30)
    a = ap.parse_args()
    import torch
    import torchvision
    from torch import nn

    import trainprof.torch

    dev = torch.device("cuda", 0)
    model = torchvision.models.resnet18(num_classes=10).to(dev)
    hook = trainprof.torch.attach(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x = torch.randn(32, 3, 128, 128, device=dev)
    y = torch.randint(0, 10, (32,), device=dev)
    kept = []
    for step in range(a.steps):
        opt.zero_grad()
        nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
        kept.append(torch.empty(2 << 20, device=dev))  # the planted leak: 8 MiB a step
        if step == a.oom_step:
            total = torch.cuda.get_device_properties(0).total_memory
            torch.empty(total, dtype=torch.uint8, device=dev)  # the planted out-of-memory error
        torch.cuda.synchronize()
    hook.close()
    print("gpu_memory: %d steps" % a.steps, flush=True)


if __name__ == "__main__":
    main()
