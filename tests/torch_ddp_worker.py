"""One rank of the DistributedDataParallel test (tests/test_torch_ddp.py).

Run as: python torch_ddp_worker.py RANK WORLD_SIZE PORT OUT_FILE.  Every rank trains the
same small model (resnorm LayerNorm and RMSNorm inside) on its contiguous slice of each
full batch, with torch.distributed (gloo, localhost) averaging the gradients, then saves
its final parameters to OUT_FILE.  build_model / full_batches / train are also what the
test's single-process run uses.
"""
import os
import sys

import torch
from torch import nn

import resnorm.torch as rt

STEPS, BATCH, D_IN, D, D_OUT = 6, 8, 16, 32, 4


def build_model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(D_IN, D), rt.LayerNorm(D), nn.GELU(), nn.Linear(D, D),
                         rt.RMSNorm(D), nn.Linear(D, D_OUT)).double()


def full_batches():
    g = torch.Generator().manual_seed(1)
    return [(torch.randn(BATCH, D_IN, generator=g, dtype=torch.float64),
             torch.randn(BATCH, D_OUT, generator=g, dtype=torch.float64))
            for _ in range(STEPS)]


def train(model, batches, lr=0.1):
    """Plain SGD on the mean squared error; returns the losses.  (Written out rather than
    torch.optim.SGD, whose first step imports torch._dynamo: seconds per process.)"""
    losses = []
    for x, y in batches:
        model.zero_grad()
        loss = nn.functional.mse_loss(model(x), y)
        loss.backward()
        with torch.no_grad():
            for p in model.parameters():
                p -= lr * p.grad
        losses.append(loss.item())
    return losses


def main(rank, world_size, port, out_file):
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world_size)
    try:
        model = build_model()
        ddp = DistributedDataParallel(model)
        per_rank = BATCH // world_size
        mine = slice(rank * per_rank, (rank + 1) * per_rank)
        train(ddp, [(x[mine], y[mine]) for x, y in full_batches()])
        torch.save(model.state_dict(), out_file)
    finally:
        dist.destroy_process_group()
    # torch 2.13 sometimes aborts in its static destructors at interpreter exit ("terminate
    # called without an active exception", about 1 run in 4 on this machine), after the
    # work above is done; skip them so the exit status reports the training alone
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4])
