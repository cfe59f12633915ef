"""Every test runs offline, with its own empty token-id cache, and with ``--jobs auto``'s timing
off (``LM_TUNE=off``: one job).

The offline switches are set at import, before any test imports ``datasets`` or
``huggingface_hub``, which read them once. The suite runs on one worker process per core
(pytest-xdist, ``-n auto`` in pyproject.toml): each worker's math, and every ``lm`` process it
starts, takes one thread, so that the workers share the cores instead of fighting over them.
A test that needs more threads sets them itself (a run's numbers do not depend on them).
"""

import os

import pytest

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["HF_DATASETS_OFFLINE"] = "1"
os.environ["LM_TUNE"] = "off"  # --jobs auto times nothing: one job (tests of it turn it on)
if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ["OMP_NUM_THREADS"] = "1"  # before torch reads it, here and in subprocesses
    import torch

    torch.set_num_threads(1)


@pytest.fixture(autouse=True)
def lm_cache(tmp_path_factory, monkeypatch):
    """A fresh LM_CACHE per test, so no test sees another's (or the user's) cache."""
    cache = tmp_path_factory.mktemp("lm-cache")
    monkeypatch.setenv("LM_CACHE", str(cache))
    return cache


@pytest.fixture(autouse=True)
def unwatched_measurements(monkeypatch):
    """A measurement is watched for other work beside it (``lm.runtime.choices.OtherWork``),
    and the other test workers are such work: unwatched here, so that a test's measurement is
    kept whatever the others do. The tests of the watch give it its readings back."""
    from lm.runtime import choices

    monkeypatch.setattr(choices, "cpu_seconds", lambda: None)


@pytest.fixture(scope="module", params=["gpt2", "llama"])
def block(request):
    """The model keys of each block a test runs over (``_support.BLOCKS``): GPT-2's, then the
    Llama-style one."""
    from _support import BLOCKS

    return BLOCKS[request.param]
