"""Hostile and broken files are refused in one line, exit status 2, and nothing they carry runs."""

from __future__ import annotations

import pickle
import shutil
from pathlib import Path

import pytest
from _support import expect_error, train_via_cli

from lm.cli import main
from lm.runs.checkpoint import latest_checkpoint

MARKER = Path("/tmp/lm-test-pwned")


class Exploit:
    """Unpickling this runs a shell command that leaves a marker file."""

    def __reduce__(self):
        import os

        return (os.system, (f"touch {MARKER}",))


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    return train_via_cli(tmp_path_factory.mktemp("hostile"), max_steps=4)


@pytest.fixture
def run(trained, tmp_path):
    """A copy of the trained run to damage; whatever the test fed it, nothing it carried ran."""
    MARKER.unlink(missing_ok=True)
    copy = tmp_path / "run"
    shutil.copytree(trained, copy)
    yield copy
    assert not MARKER.exists(), "a hostile file ran code"


def sample(run: Path, *extra: str) -> list[str]:
    return ["sample", str(run), "--prompt", "x", "--max-new-tokens", "2", *extra]


def test_a_pickle_in_place_of_the_weights_is_never_unpickled(run, capsys):
    weights = latest_checkpoint(run) / "model.safetensors"
    weights.write_bytes(pickle.dumps(Exploit()))
    expect_error(capsys, sample(run), "damaged file")
    # Without state.json's checksum the safetensors reader itself refuses it.
    lone = run / "lone"
    lone.mkdir()
    shutil.copy(weights, lone / "model.safetensors")
    expect_error(capsys, sample(run, "--checkpoint", str(lone)), "damaged safetensors file")


def test_planted_pickles_beside_the_checkpoint_are_ignored(run, capsys):
    ckpt = latest_checkpoint(run)
    for name in ("optimizer.pt", "model.pt", "training_args.bin"):
        (ckpt / name).write_bytes(pickle.dumps(Exploit()))
    assert main(sample(run)) == 0
    capsys.readouterr()
    assert not MARKER.exists()


def test_yaml_with_a_python_tag_is_refused(run, capsys):
    (run / "config.yaml").write_text(f"!!python/object/apply:os.system ['touch {MARKER}']\n")
    expect_error(capsys, sample(run), "not a valid safe YAML config")
    bad = run / "bad.yaml"
    bad.write_text(f"model: !!python/object/apply:os.system ['touch {MARKER}']\n")
    expect_error(
        capsys, ["train", str(bad), "--out", str(run / "x")], "not a valid safe YAML config"
    )


def test_truncated_and_bit_flipped_weights_are_refused(run, capsys):
    weights = latest_checkpoint(run) / "model.safetensors"
    data = weights.read_bytes()
    flipped = bytearray(data)
    flipped[len(data) // 2] ^= 0x10  # inside the tensor data: only the checksum can tell
    weights.write_bytes(bytes(flipped))
    expect_error(capsys, sample(run), "damaged file (its checksum does not match")
    lone = run / "lone"
    lone.mkdir()
    (lone / "model.safetensors").write_bytes(data[: len(data) // 2])
    expect_error(capsys, sample(run, "--checkpoint", str(lone)), "damaged safetensors file")
    header = bytearray(data)
    header[10] ^= 0xFF  # inside the JSON header
    (lone / "model.safetensors").write_bytes(bytes(header))
    expect_error(capsys, sample(run, "--checkpoint", str(lone)), "damaged safetensors file")


def test_a_tokenizer_that_is_not_json_is_refused(run, capsys):
    (run / "tokenizer.json").write_text("this is { not json")
    expect_error(capsys, sample(run), "tokenizer.json")


def test_a_config_whose_shapes_disagree_with_the_weights_is_refused(run, capsys):
    config = run / "config.yaml"
    config.write_text(config.read_text().replace("d_model: 32", "d_model: 64"))
    expect_error(capsys, sample(run), "weights do not fit this model")
    config.write_text(config.read_text().replace("d_model: 64", "d_model: 32"))
    config.write_text(config.read_text().replace("n_layer: 2", "n_layer: 3"))
    expect_error(capsys, sample(run), "weights do not fit this model (missing")


def test_a_damaged_state_file_is_refused_on_resume(run, capsys):
    (latest_checkpoint(run) / "state.json").write_text("{ nope")
    cfg = run / "config.yaml"
    expect_error(capsys, ["train", str(cfg), "--out", str(run), "--resume"], "bad JSON")
