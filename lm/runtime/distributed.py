"""Many processes through ``torchrun``: PyTorch DDP, NCCL on GPUs and Gloo on CPUs.

``torchrun --nproc_per_node=N -m lm train CONFIG`` sets ``RANK``, ``LOCAL_RANK`` and
``WORLD_SIZE`` (and, across machines, the rendezvous); without them this is one process and
every helper here is a no-op.
"""

from __future__ import annotations

import datetime
import hashlib
import os
import socket
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from lm.config.errors import SharedError
from lm.runtime.launch import mark_joined


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


def init_world(device_type: str, timeout_s: float = 3600.0) -> World:
    """Join the process group that torchrun describes in the environment, if any. A collective
    waits up to ``timeout_s`` for every process (``train.dist_timeout_s``): long enough for the
    main process to prepare the data while the others wait at a barrier."""
    if "RANK" not in os.environ or int(os.environ.get("WORLD_SIZE", "1")) <= 1:
        return World()
    world = World(
        rank=int(os.environ["RANK"]),
        local_rank=int(os.environ.get("LOCAL_RANK", "0")),
        size=int(os.environ["WORLD_SIZE"]),
    )
    mark_joined()
    if not dist.is_initialized():
        backend = "nccl" if device_type == "cuda" else "gloo"
        if device_type == "cuda":
            torch.cuda.set_device(world.local_rank)
        timeout = datetime.timedelta(seconds=timeout_s)
        dist.init_process_group(backend=backend, timeout=timeout)
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


def all_reduce_min(world: World, tensor: torch.Tensor) -> torch.Tensor:
    """The minimum of a tensor over all processes (in place; no host sync on NCCL)."""
    if world.distributed:
        dist.all_reduce(tensor, op=dist.ReduceOp.MIN)
    return tensor


def flagged_rank(world: World, flag: bool, device: torch.device) -> int | None:
    """The same answer on every process: the highest rank whose ``flag`` is set (a stop signal,
    a failed write), or None. A host sync: for log and checkpoint steps only."""
    if not world.distributed:
        return world.rank if flag else None
    t = torch.tensor([world.rank + 1 if flag else 0], device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    rank = int(t.item()) - 1
    return None if rank < 0 else rank


def shared_failure(world: World, error: str | None, device: torch.device, what: str) -> str | None:
    """After something only some processes do (rank 0 writes checkpoints), the same answer on
    every process: None if it went well everywhere, else a line naming the rank that failed."""
    failed = flagged_rank(world, error is not None, device)
    if failed is None or not world.distributed:
        return error
    if error is not None:
        return f"rank {failed}: {error}"
    return f"rank {failed} could not write the {what} (see its message)"


def check_same_resume(world: World, step: int | None, config: bytes) -> None:
    """Every process must resume from the same checkpoint step with the same ``config`` (its
    bytes), or every process stops with the same line naming the first one that differs from
    rank 0."""
    if not world.distributed:
        return
    digest = hashlib.sha256(config).hexdigest()
    views: list[Any] = [None] * world.size
    dist.all_gather_object(views, (step, digest, socket.gethostname()))
    step0, hash0, host0 = views[0]
    for rank, (step_r, hash_r, host) in enumerate(views):
        if step_r != step0:
            seen = "no checkpoint" if step_r is None else f"checkpoint step {step_r}"
            want = "no checkpoint" if step0 is None else f"step {step0}"
            raise SharedError(
                f"resume: rank {rank} on {host} finds {seen} in the run directory while rank 0 "
                f"on {host0} finds {want}; every machine must see the same run directory "
                "(a shared filesystem)"
            )
        if hash_r != hash0:
            raise SharedError(
                f"resume: rank {rank} on {host} reads a different config than rank 0 on "
                f"{host0}; every process must be given the same config and run directory"
            )
