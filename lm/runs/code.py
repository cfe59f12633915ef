"""A run's record of the code of its position schemes written outside lm (docs/positions.md,
"Your own scheme"): run.json's ``schemes`` keeps each one's spec, file and sha256, and the run
folder a copy of the file (``schemes/<sha256>_<name>.py``), so that the run reloads and
reproduces after the file changes or moves. A run's config is read back through
:func:`read_run_config`, which imports a copy only with ``--trust-code`` (``lm.config.outside``)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

from lm.config.load import load_config
from lm.config.outside import RunCode, from_run, is_spec, loaded
from lm.config.sections import Config, ModelConfig

CONFIG, PROVENANCE = "config.yaml", "run.json"  # as lm.runs.directory, which imports this
COPIES = "schemes"


def record_code(run_dir: Path, model: ModelConfig) -> list[dict[str, Any]]:
    """Copy the file of each outside scheme of ``model`` into the run; what run.json keeps."""
    kept = []
    for spec in filter(is_spec, dict.fromkeys(model.layer_positions)):
        scheme = loaded(spec)
        copy = Path(COPIES) / f"{scheme.sha256[:16]}_{scheme.file.name}"
        (run_dir / COPIES).mkdir(exist_ok=True)
        shutil.copyfile(scheme.file, run_dir / copy)
        kept.append(
            {"spec": spec, "file": str(scheme.file), "copy": str(copy), "sha256": scheme.sha256}
        )
    return kept


def run_code(run_dir: Path) -> RunCode:
    """What run.json records of the run's schemes' code (nothing, for a run of builtins)."""
    try:
        kept = json.loads((run_dir / PROVENANCE).read_text(encoding="utf-8")).get("schemes", [])
        copies = {k["spec"]: (run_dir / k["copy"], k["sha256"]) for k in kept}
        originals = {k["spec"]: Path(k["file"]) for k in kept}
    except (OSError, ValueError, AttributeError, KeyError, TypeError):
        copies, originals = {}, {}  # then a config naming such a scheme is refused
    return RunCode(run_dir, copies, originals)


def read_run_config(run_dir: str | Path) -> Config:
    """A run's config.yaml: the schemes it names outside lm are read from the run's copies with
    ``--trust-code`` (or as this command loaded them, if the same bytes), else refused."""
    run_dir = Path(run_dir)
    with from_run(run_code(run_dir)):
        return load_config(run_dir / CONFIG)
