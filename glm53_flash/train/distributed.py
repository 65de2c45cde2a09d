"""torchrun / DDP support: rank discovery, process-group setup, and the cross-rank sums training needs.

Run `torchrun --nproc_per_node=N -m glm53_flash.cli pretrain ...`: each rank takes its slice of the
global batch, gradients are averaged by DDP, and only rank 0 writes files.
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


def teardown_distributed(ctx: DistributedContext) -> None:
    if ctx.enabled and dist.is_initialized():
        dist.destroy_process_group()
