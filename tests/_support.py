"""Small configs and helpers shared by the trainer tests."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from unittest import mock

import pytest
import torch
import torch.nn.functional as F
import yaml

import lm.training.step
from lm.config.errors import LMError
from lm.config.load import config_from_dict, merge
from lm.config.sections import Config
from lm.data.batches import TrainBatches
from lm.model.transformer import loss_sum
from lm.runtime.device import autocast_context

TINY: dict[str, dict[str, Any]] = {
    "model": {"context_length": 32, "n_layer": 2, "n_head": 2, "d_model": 32},
    "data": {"source": "builtin:python-docs", "tokenizer": "char", "mode": "packed"},
    "train": {
        "max_steps": 30,
        "batch_size": 8,
        "lr": 3e-3,
        "min_lr": 3e-4,
        "warmup_steps": 5,
        "eval_every": 15,
        "eval_steps": 4,
        "checkpoint_every": 10,
        "log_every": 5,
        "device": "cpu",
        "dtype": "fp32",
        "compile": False,
        "seed": 7,
    },
}


BLOCKS: dict[str, dict[str, Any]] = {
    "gpt2": {},
    "llama": {"norm": "rmsnorm", "mlp": "swiglu", "n_kv_head": 1, "qk_norm": True},
}
"""The two blocks the model's tests run over (the ``block`` fixture): GPT-2's (LayerNorm, GELU,
a key/value head per query head) and a Llama-style one with every new key away from GPT-2's:
RMSNorm, SwiGLU, QK-norm, and one key/value head (the tests' models have two query heads)."""


def tiny_config(**sections: dict[str, Any]) -> Config:
    return config_from_dict(merge(TINY, sections))


def write_config(path: Path, **sections: dict[str, Any]) -> Path:
    path.write_text(yaml.safe_dump(merge(TINY, sections)))
    return path


def train_via_cli(root: Path, **train: Any) -> Path:
    """A tiny run trained through ``lm train`` into ``root/run`` (data cached under root)."""
    from lm.cli import main

    cfg = write_config(root / "tiny.yaml", data={"cache_dir": str(root / "cache")}, train=train)
    assert main(["train", str(cfg), "--out", str(root / "run"), "--quiet"]) == 0
    return root / "run"


def weights(run_dir: Path) -> dict[str, torch.Tensor]:
    """The newest checkpoint's weights."""
    from safetensors.torch import load_file

    from lm.runs.checkpoint import latest_checkpoint

    return load_file(str(latest_checkpoint(run_dir) / "model.safetensors"))


def assert_same_weights(a: Path, b: Path) -> None:
    """Two runs' newest checkpoints hold the same weights, bit for bit."""
    wa, wb = weights(a), weights(b)
    assert wa.keys() == wb.keys()
    for k in wa:
        torch.testing.assert_close(wa[k], wb[k], rtol=0, atol=0, msg=k)


def assert_one_line(error: BaseException | pytest.ExceptionInfo, *words: str) -> str:
    """A user error as the CLI prints it: an LMError whose message is one non-empty line naming
    every word. ``error`` is the exception or what ``pytest.raises`` caught; returns the text."""
    if isinstance(error, pytest.ExceptionInfo):
        error = error.value
    assert isinstance(error, LMError), repr(error)
    message = str(error)
    assert message and "\n" not in message, message
    for word in words:
        assert word in message, message
    return message


def assert_refused(code: int | str | None, err: str, *words: str) -> None:
    """The command line refused: exit status 2 and one line on standard error (no traceback)
    naming every word."""
    assert code == 2, err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    for word in words:
        assert word in err, err


def expect_error(capsys: pytest.CaptureFixture, argv: list[str], *words: str) -> str:
    """Run ``lm ARGV`` in this process and assert it is refused as :func:`assert_refused` says
    (argparse's own errors included); returns what it printed on standard error."""
    from lm.cli import main

    try:
        code = main(argv)
    except SystemExit as e:
        code = e.code
    err = capsys.readouterr().err
    assert_refused(code, err, *words)
    return err


@contextlib.contextmanager
def nan_loss_at_step(step: int) -> Iterator[None]:
    """While open, the training loss of optimizer step ``step`` (0-based) is NaN, and through it
    the step's gradients, as in a diverging run. Patched from outside, in this process."""
    current = {"step": -1}
    batches_of, loss_sum = TrainBatches.step, lm.training.step.loss_sum

    def step_batches(self: TrainBatches, i: int) -> Any:
        current["step"] = i
        return batches_of(self, i)

    def poisoned_loss_sum(*args: Any, **kwargs: Any) -> Any:
        loss = loss_sum(*args, **kwargs)
        return loss * float("nan") if current["step"] == step else loss

    with (
        mock.patch.object(TrainBatches, "step", step_batches),
        mock.patch.object(lm.training.step, "loss_sum", poisoned_loss_sum),
    ):
        yield


def metrics(run_dir: Path) -> list[dict[str, Any]]:
    """The run's metrics.jsonl, read as strict JSON (NaN and Infinity are not JSON)."""
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    strict = {"parse_constant": lambda word: pytest.fail(f"metrics.jsonl holds {word}")}
    return [json.loads(line, **strict) for line in lines if line.strip()]


def losses(run_dir: Path, key: str = "train_loss") -> dict[int, float]:
    return {m["step"]: m[key] for m in metrics(run_dir) if key in m}


def varied_corpus(path: Path, n: int = 60) -> Path:
    """A JSONL corpus of documents with very different lengths (padding matters)."""
    words = [
        "attention",
        "position",
        "rotary",
        "sinusoid",
        "query",
        "key",
        "value",
        "mask",
        "softmax",
        "head",
    ]
    with path.open("w") as f:
        for i in range(n):
            text = " ".join(words[(i * 7 + j) % len(words)] for j in range(1 + (i * 13) % 17))
            f.write(json.dumps({"text": text}) + "\n")
    return path


def assert_bf16_step_matches_fp32(model, ids, device) -> None:
    """One forward and backward pass of ``model`` on ``ids [B, T+1]`` in fp32, then under bf16
    autocast: bf16 logits, an fp32 loss within bf16 precision of fp32's, gradients pointing the
    same way (cosine > 0.999)."""
    results = []
    for dtype in (torch.float32, torch.bfloat16):
        model.zero_grad()
        with autocast_context(device, dtype):
            logits = model(ids[:, :-1])
        assert logits.dtype == dtype
        loss = loss_sum(logits, ids[:, 1:]) / ids[:, 1:].numel()
        assert loss.dtype == torch.float32
        loss.backward()
        grads = torch.cat([p.grad.flatten() for p in model.parameters()])
        results.append((loss.detach(), grads))
    (loss32, grad32), (loss16, grad16) = results
    torch.testing.assert_close(loss16, loss32, rtol=1e-3, atol=0)
    cosine = F.cosine_similarity(grad16, grad32, dim=0)
    assert cosine > 0.999, cosine


def assert_padding_is_invisible(model, seqs, T: int, pad: int = 0) -> None:
    """Each sequence of ``seqs`` (1-D token tensors) padded on the right, then on the left, into
    one ``[len(seqs), T]`` batch: every real token's logits equal those of its sequence alone."""
    device = seqs[0].device
    with torch.no_grad():
        alone = [model(s[None])[0] for s in seqs]
        for side in ("right", "left"):
            ids = torch.full((len(seqs), T), pad, dtype=torch.long, device=device)
            key_mask = torch.zeros(len(seqs), T, dtype=torch.bool, device=device)
            for i, s in enumerate(seqs):
                sl = slice(0, len(s)) if side == "right" else slice(T - len(s), T)
                ids[i, sl], key_mask[i, sl] = s, True
            logits = model(ids, key_mask=key_mask)
            assert torch.isfinite(logits).all()
            for i in range(len(seqs)):
                torch.testing.assert_close(logits[i][key_mask[i]], alone[i], atol=2e-5, rtol=1e-4)


def attention_layer(d_model: int, n_head: int, **model: Any):
    """One attention layer on its own, built from a model config: ``(layer, config)``."""
    from lm.config.sections import ModelConfig
    from lm.model.attention import MultiHeadAttention

    config = ModelConfig(d_model=d_model, n_head=n_head, **model)
    return MultiHeadAttention(config), config


def self_attend(layer, config, x, *, positions=None, kernel=None, causal=True, **masks):
    """``layer`` run on ``x [B, T, d]`` as its model would run it: the positions and its window's
    mask made once for the pass (``masks``: ``key_mask``, ``segments``), a shared bias made by
    the layer's scheme; ``positions`` places the tokens elsewhere than the masks say."""
    import dataclasses

    import lm.model.masks as m

    ids = torch.zeros(x.shape[:2], dtype=torch.long, device=x.device)
    key_mask, segments = masks.get("key_mask"), masks.get("segments")
    where = m.positions(config, ids, key_mask, segments, training=layer.training)
    if positions is not None:
        where = dataclasses.replace(where, queries=positions, keys=positions)
    mask = m.masks(
        config, where, key_mask, segments, causal=causal, training=layer.training, kernel=kernel
    )[layer.window]
    if layer.position.one_bias:
        where.biases[type(layer.position)] = layer.position.bias(where, mask)
    return layer(x, where, mask)


@contextlib.contextmanager
def fused_calls() -> Iterator[list[int]]:
    """While open, counts the calls of PyTorch's fused attention
    (``torch.nn.functional.scaled_dot_product_attention``): how a test tells which kernel ran,
    the fused one (a call per layer) or the notes' formula written out (none). Yields a list
    whose length is the count so far."""
    calls: list[int] = []
    real = F.scaled_dot_product_attention

    def counted(*args: Any, **kwargs: Any) -> torch.Tensor:
        calls.append(1)
        return real(*args, **kwargs)

    with mock.patch.object(F, "scaled_dot_product_attention", counted):
        yield calls


HOOKS = Path(__file__).parent / "hooks"


class Pauses:
    """Processes started with :meth:`env` stop where ``rules`` say (tests/hooks/sitecustomize.py)
    and tell this object on a FIFO in ``folder``; :meth:`wait` reads their lines. ``{fifo}`` in
    a rule's ``tell`` or ``wait_for`` is this object's FIFO (another name: another FIFO there)."""

    def __init__(self, folder: Path, rules: list[dict[str, Any]]):
        import os

        self.fifo = folder / "pauses.fifo"
        for rule in rules:
            for key in ("tell", "wait_for"):
                if key in rule:
                    rule[key] = str(folder / rule[key]) if rule[key] != "{fifo}" else str(self.fifo)
                    if not Path(rule[key]).exists():
                        os.mkfifo(rule[key])
        if not self.fifo.exists():
            os.mkfifo(self.fifo)
        # Held open for reading and writing: no writer ever waits for a reader, and reading
        # never ends early because no writer is open.
        self._fd = os.open(self.fifo, os.O_RDWR | os.O_NONBLOCK)
        self.rules, self._buffer = rules, b""

    def env(self, base: dict[str, str] | None = None) -> dict[str, str]:
        import os

        env = dict(os.environ if base is None else base)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(HOOKS), env.get("PYTHONPATH", "")) if p)
        env["LM_TEST_PAUSE"] = json.dumps(self.rules)
        return env

    def wait(self, n: int = 1, ended: Any = None, timeout: float = 300.0) -> list[str] | None:
        """The next ``n`` lines told; None if ``ended`` (a Popen) ends first. ``timeout`` only
        stops a broken test from hanging: nothing here waits on time otherwise."""
        import os
        import select

        watched = [self._fd] + ([ended.stderr] if ended is not None else [])
        while self._buffer.count(b"\n") < n:
            ready, _, _ = select.select(watched, [], [], timeout)
            if not ready:
                pytest.fail(f"no process told {self.fifo.name} within {timeout:.0f} s")
            if self._fd in ready:
                self._buffer += os.read(self._fd, 4096)
            elif ended is not None and ended.poll() is None and ended.stderr.readline():
                continue  # it said something else; still running
            elif ended is not None and self._buffer.count(b"\n") < n:
                ended.wait()
                return None
        lines = self._buffer.decode().splitlines()
        self._buffer = "\n".join(lines[n:]).encode() + (b"\n" if lines[n:] else b"")
        return lines[:n]

    def close(self) -> None:
        import os

        os.close(self._fd)
