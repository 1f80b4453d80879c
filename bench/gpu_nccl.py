"""A one-GPU NCCL job for scripts/gpu-check's `nccl` part: DistributedDataParallel over the
`nccl` backend with world size 1 (rank 0, a file store), trainprof's torch adapter attached,
a model big enough that backward's kernels run while DDP's bucket all-reduces do. Each step
also all-reduces a 64 MiB tensor beside a matmul on another stream, so the detailed window has
communication kernels with and without compute beside them (docs/report.md, "Communication
against compute").

    python3 bench/gpu_nccl.py --steps 60 --store DIR/store
"""

import argparse
import datetime
import os


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--store", required=True)
    a = ap.parse_args()
    import torch
    import torch.distributed as dist
    from torch import nn

    import trainprof.torch

    os.environ.setdefault("RANK", "0")
    torch.cuda.set_device(0)
    dist.init_process_group("nccl", init_method="file://" + a.store, rank=0, world_size=1,
                            timeout=datetime.timedelta(seconds=120))
    dev = torch.device("cuda", 0)
    model = nn.Sequential(*[nn.Sequential(nn.Linear(4096, 4096), nn.ReLU()) for _ in range(8)]).to(dev)
    ddp = nn.parallel.DistributedDataParallel(model, device_ids=[0], bucket_cap_mb=16)
    hook = trainprof.torch.attach(ddp)
    opt = torch.optim.SGD(ddp.parameters(), lr=1e-4)
    x = torch.randn(256, 4096, device=dev)
    big = torch.ones(16 << 20, device=dev)
    side = torch.cuda.Stream()
    m = torch.randn(4096, 4096, device=dev)
    for _ in range(a.steps):
        opt.zero_grad()
        loss = ddp(x).pow(2).mean()
        loss.backward()
        with torch.cuda.stream(side):
            m2 = m @ m
        dist.all_reduce(big)
        torch.cuda.current_stream().wait_stream(side)
        opt.step()
        del m2
        torch.cuda.synchronize()
    hook.close()
    dist.destroy_process_group()
    print("gpu_nccl: %d steps" % a.steps, flush=True)


if __name__ == "__main__":
    main()
