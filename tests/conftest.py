"""Every test runs offline, with its own empty token-id cache.

The offline switches are set at import, before any test imports ``datasets`` or
``huggingface_hub``, which read them once.
"""

import os

import pytest

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["HF_DATASETS_OFFLINE"] = "1"


@pytest.fixture(autouse=True)
def lm_cache(tmp_path_factory, monkeypatch):
    """A fresh LM_CACHE per test, so no test sees another's (or the user's) cache."""
    cache = tmp_path_factory.mktemp("lm-cache")
    monkeypatch.setenv("LM_CACHE", str(cache))
    return cache
