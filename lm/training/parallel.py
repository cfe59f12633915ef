"""How the model is spread over ``torchrun``'s processes: DDP replicates it, FSDP2 shards it.

``train.parallel: ddp`` keeps a whole copy of the weights, gradients and optimizer state on every
process and all-reduces the gradients. ``train.parallel: fsdp`` (PyTorch's ``fully_shard``, one
unit per transformer block and one for the rest) keeps only ``1/world`` of each on a process: a
block's weights are all-gathered just before its forward and backward and freed after, and its
gradients are reduce-scattered, so a model bigger than one GPU's memory trains.

Checkpoints do not depend on the layout: a sharded run gathers the full weights and optimizer
state onto the main process (CPU) and writes the same files a one-process run writes, and every
process reads those files back into its own shards. ``torch.compile`` wraps the DDP or FSDP
model, not the reverse, so that gradient communication can overlap the backward pass.

FSDP and the distributed state dicts are imported where a run uses them: together they take
about a second to import, which a one-process run, most runs, would pay at every start.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from torch import nn

from lm.config.sections import TrainConfig
from lm.runs.checkpoint import CheckpointError, FullState, first_line, read_optimizer, read_weights
from lm.runtime.device import compile_enabled, compile_model
from lm.runtime.distributed import World


def wrap_model(
    raw_model: nn.Module, tc: TrainConfig, world: World, device: torch.device, dtype: torch.dtype
) -> nn.Module:
    """What the training steps run: ``raw_model`` DDP-wrapped or sharded (in place, FSDP) when
    there are several processes, then compiled if configured.

    Build the optimizer after this: sharding replaces the parameters by their shards.
    """
    model = raw_model
    if world.distributed and tc.parallel == "fsdp":
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

        # (fp16 is refused before: TrainConfig, and lm.runtime.device for train.dtype: auto.)
        # bf16: the gathered weights and the forward/backward run in bf16; gradients are reduced
        # and the sharded master weights and optimizer stay fp32. Autocast stays on as without
        # FSDP, so norms, softmax and the loss still compute in fp32.
        policy = MixedPrecisionPolicy(param_dtype=dtype, reduce_dtype=torch.float32)
        if dtype == torch.float32:
            policy = MixedPrecisionPolicy()
        for block in raw_model.blocks:
            fully_shard(block, mp_policy=policy)
        fully_shard(raw_model, mp_policy=policy)  # the embedding, final norm and tied head
    elif world.distributed:
        from torch.nn.parallel import DistributedDataParallel

        model = DistributedDataParallel(
            raw_model, device_ids=[device.index] if device.type == "cuda" else None
        )
    return compile_model(model, device) if compile_enabled(tc.compile, device) else model


def is_sharded(raw_model: nn.Module) -> bool:
    # No module is FSDP's before FSDP is imported (by wrap_model, when a run shards).
    if "torch.distributed.fsdp" not in sys.modules:
        return False
    from torch.distributed.fsdp import FSDPModule

    return isinstance(raw_model, FSDPModule)


@contextlib.contextmanager
def skip_gradient_sync(model: nn.Module) -> Iterator[None]:
    """Accumulate this micro-batch's gradients locally, without communication: DDP's
    ``no_sync``, or FSDP's gradient sync switched off until the block ends (the last micro-batch
    of a step then reduces the sum). ``model`` may be compiled; attributes reach the wrapper."""
    if is_sharded(getattr(model, "_orig_mod", model)):
        model.set_requires_gradient_sync(False)
        try:
            yield
        finally:
            model.set_requires_gradient_sync(True)
    else:
        with model.no_sync():
            yield


def _aliases(raw_model: nn.Module) -> dict[str, str]:
    """Second names of shared parameters (the tied head) -> the name a checkpoint keeps."""
    first = {id(p): n for n, p in reversed(list(raw_model.named_parameters()))}
    return {
        name: first[id(p)]
        for name, p in raw_model.named_parameters(remove_duplicate=False)
        if first[id(p)] != name
    }


def _param_names(raw_model: nn.Module, optimizer: torch.optim.Optimizer) -> list[str]:
    """Parameter names in the optimizer's order, the order ``optimizer.state_dict()`` numbers
    them in."""
    names = {id(p): n for n, p in raw_model.named_parameters()}
    return [names[id(p)] for group in optimizer.param_groups for p in group["params"]]


def gather_full_state(
    raw_model: nn.Module, optimizer: torch.optim.Optimizer, world: World
) -> FullState | None:
    """The full weights and optimizer state of a sharded model, on the main process (CPU
    tensors, in a one-process checkpoint's form); None on the others.

    Every process must call this: the gathers are collectives.
    """
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        get_model_state_dict,
        get_optimizer_state_dict,
    )

    full = StateDictOptions(full_state_dict=True, cpu_offload=True)
    weights = get_model_state_dict(raw_model, options=full)
    named = get_optimizer_state_dict(raw_model, optimizer, options=full)
    if not world.is_main:
        return None
    aliases = _aliases(raw_model)
    weights = {k: v.contiguous() for k, v in weights.items() if k not in aliases}
    number = {name: i for i, name in enumerate(_param_names(raw_model, optimizer))}
    numbered = {
        "state": {number[name]: slots for name, slots in named["state"].items()},
        "param_groups": [
            {**group, "params": [number[name] for name in group["params"]]}
            for group in named["param_groups"]
        ],
    }
    return FullState(weights, aliases, numbered)


def load_full_state(
    raw_model: nn.Module, optimizer: torch.optim.Optimizer, checkpoint: Path, saved: dict[str, Any]
) -> None:
    """Load a checkpoint's full weights and optimizer state (``saved``: its state.json) into
    this process's shards. Every process reads the files (a shared filesystem is required; a
    damaged file then fails on every process alike, none waits on the others) and keeps its
    own slice of them."""
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        set_model_state_dict,
        set_optimizer_state_dict,
    )

    weights, optimizer_state = read_weights(checkpoint), read_optimizer(checkpoint, saved)
    for alias, kept in _aliases(raw_model).items():
        if kept in weights:
            weights[alias] = weights[kept]
    options = StateDictOptions(full_state_dict=True)
    try:
        set_model_state_dict(raw_model, weights, options=options)
    except (KeyError, RuntimeError, ValueError) as e:
        raise CheckpointError(
            f"{checkpoint}: the weights do not fit this model ({first_line(e)})"
        ) from None
    names = _param_names(raw_model, optimizer)
    try:
        named = {
            "state": {names[int(i)]: slots for i, slots in optimizer_state["state"].items()},
            "param_groups": [
                {**group, "params": [names[int(i)] for i in group["params"]]}
                for group in optimizer_state["param_groups"]
            ],
        }
        set_optimizer_state_dict(raw_model, optimizer, named, options=options)
    except (IndexError, KeyError, RuntimeError, ValueError) as e:
        raise CheckpointError(
            f"{checkpoint}: cannot restore the optimizer ({first_line(e)})"
        ) from None
