"""torchrun / DDP support: rank discovery, process-group setup, and the cross-rank sums training needs.

Run `torchrun --nproc_per_node=N -m glm53_flash.cli pretrain ...` (or `... rl ...`). Pretraining:
each rank takes its slice of the global batch and DDP averages the gradients. RL: each rank takes a
disjoint share of every update's groups and `all_sum_gradients` adds the ranks' gradients (see
train/rl_run.py). Either way only rank 0 writes files (the run directory's lock included:
`lock_on_main`).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import torch.distributed as dist


@dataclass(frozen=True)
class DistributedContext:
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0

    @property
    def enabled(self) -> bool:
        return self.world_size > 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def all_sum(self, tensor: torch.Tensor) -> torch.Tensor:
        """Sum across ranks (no gradient); identity in a single process."""
        if not self.enabled:
            return tensor
        tensor = tensor.detach().clone()
        dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
        return tensor

    def share(self, count: int) -> tuple[int, int]:
        """This rank's contiguous share [lo, hi) of `count` items (ranks differ by at most one item)."""
        return count * self.rank // self.world_size, count * (self.rank + 1) // self.world_size

    def all_gather_objects(self, value) -> list:
        """Every rank's `value` (any picklable object), in rank order; [value] in a single process."""
        if not self.enabled:
            return [value]
        gathered = [None] * self.world_size
        dist.all_gather_object(gathered, value)
        return gathered

    def all_sum_gradients(self, parameters) -> None:
        """Sum every parameter's gradient across ranks, in place.

        A parameter gets a gradient when any rank computed one (a rank with nothing to train holds
        None and contributes zeros); one that no rank touched keeps None, as in a single process,
        so the optimizer skips it there too.
        """
        if not self.enabled:
            return
        parameters = list(parameters)
        if not parameters:
            return
        device = parameters[0].device
        present = self.all_sum(torch.tensor([float(p.grad is not None) for p in parameters], device=device))
        touched = [p for p, flag in zip(parameters, present.tolist()) if flag > 0]
        for param in touched:
            if param.grad is None:
                param.grad = torch.zeros_like(param)
        if not touched:
            return
        flat = torch.cat([p.grad.reshape(-1) for p in touched])
        dist.all_reduce(flat, op=dist.ReduceOp.SUM)
        offset = 0
        for param in touched:
            size = param.grad.numel()
            param.grad.copy_(flat[offset : offset + size].view_as(param.grad))
            offset += size

    def barrier(self) -> None:
        if self.enabled:
            dist.barrier()


def setup_distributed(device_type: str) -> DistributedContext:
    """Join the process group when launched by torchrun (WORLD_SIZE > 1); else a single process."""
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    if world_size <= 1:
        return DistributedContext()
    rank = int(os.environ["RANK"])
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if not dist.is_initialized():
        dist.init_process_group(backend="nccl" if device_type == "cuda" else "gloo")
    return DistributedContext(rank=rank, world_size=world_size, local_rank=local_rank)


def lock_on_main(ctx: DistributedContext, directory, device):
    """Rank 0 takes the run directory's lock (train/rundir.py) and returns it; the other ranks write
    nothing and get None. Every rank learns whether rank 0 could lock it (one-line `RunInUse`)."""
    from glm53_flash.train.rundir import RunInUse, RunLock

    lock, error = None, None
    if ctx.is_main:
        try:
            lock = RunLock(directory).acquire()
        except RunInUse as refused:
            error = refused
    if ctx.enabled:
        failed = ctx.all_sum(torch.tensor([0.0 if error is None else 1.0], device=device))
        if float(failed[0]) and error is None:
            error = RunInUse(f"{directory} is in use by another run; rank 0 could not lock it")
    if error is not None:
        raise error
    return lock


def teardown_distributed(ctx: DistributedContext) -> None:
    if ctx.enabled and dist.is_initialized():
        dist.destroy_process_group()
