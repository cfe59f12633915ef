"""Many processes through ``torchrun``: PyTorch DDP, NCCL on GPUs and Gloo on CPUs.

``torchrun --nproc_per_node=N -m lm train CONFIG`` sets ``RANK``, ``LOCAL_RANK`` and
``WORLD_SIZE`` (and, across machines, the rendezvous); without them this is one process and
every helper here is a no-op.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import torch.distributed as dist


@dataclass(frozen=True)
class World:
    rank: int = 0
    local_rank: int = 0
    size: int = 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.size > 1


def init_world(device_type: str) -> World:
    """Join the process group that torchrun describes in the environment, if any."""
    if "RANK" not in os.environ or int(os.environ.get("WORLD_SIZE", "1")) <= 1:
        return World()
    world = World(
        rank=int(os.environ["RANK"]),
        local_rank=int(os.environ.get("LOCAL_RANK", "0")),
        size=int(os.environ["WORLD_SIZE"]),
    )
    if not dist.is_initialized():
        backend = "nccl" if device_type == "cuda" else "gloo"
        if device_type == "cuda":
            torch.cuda.set_device(world.local_rank)
        dist.init_process_group(backend=backend)
    return world


def close_world(world: World) -> None:
    if world.distributed and dist.is_initialized():
        dist.destroy_process_group()


def barrier(world: World) -> None:
    if world.distributed:
        dist.barrier()


def all_reduce_sum(world: World, tensor: torch.Tensor) -> torch.Tensor:
    """Sum a tensor over all processes (in place) and return it."""
    if world.distributed:
        dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
    return tensor


def broadcast_flag(world: World, flag: bool, device: torch.device) -> bool:
    """True on every process if it is True on any (a stop request, a failed write)."""
    if not world.distributed:
        return flag
    t = torch.tensor([1.0 if flag else 0.0], device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return bool(t.item())
