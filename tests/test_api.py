"""The Python API at the package's face, through the calls docs/python-api.md documents: train,
load, generate and loss_at give what the command line gives, the notes' formulas give the notes'
numbers, ``import lm`` stays light, and the tutorial notebook runs."""

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from _support import tiny_config, write_config

import lm
from lm.cli import main

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """One tiny run trained through ``lm.train`` from a config file with overrides."""
    root = tmp_path_factory.mktemp("api")
    config = write_config(root / "tiny.yaml", data={"cache_dir": str(root / "cache")})
    result = lm.train(config, root / "run", overrides=["train.max_steps=20"], quiet=True)
    return root, result


def test_train_from_a_file_with_overrides_and_from_a_config(trained, tmp_path):
    root, result = trained
    assert result.status == "done" and result.step == 20 and result.run_dir == root / "run"
    assert math.isfinite(result.val_loss)
    config = tiny_config(train={"max_steps": 4, "eval_every": 0}, data={"cache_dir": str(root)})
    again = lm.train(config, tmp_path / "obj", quiet=True)
    assert again.status == "done" and again.step == 4
    # Overrides apply to a Config as to a file; one text is one override.
    again = lm.train(config, tmp_path / "x", overrides="train.max_steps=2", quiet=True)
    assert again.step == 2 and again.run_dir == tmp_path / "x"
    with pytest.raises(lm.config.LMError, match="already"):  # a run is never clobbered
        lm.train(config, tmp_path / "obj", quiet=True)


def test_load_generate_and_loss_at_give_what_the_command_line_gives(trained, capsys):
    root, _ = trained
    run = lm.load(root / "run", device="cpu")
    assert run.step == 20 and run.config.train.max_steps == 20 and not run.model.training
    texts = lm.generate(run, ["The for", ""], max_new_tokens=12)
    assert len(texts) == 2 and texts[0].startswith("The for")
    assert lm.generate(run, "The for", max_new_tokens=12) == texts[:1]  # one string, one text
    argv = ["sample", str(root / "run"), "--prompt", "The for", "--prompt", ""]
    assert main([*argv, "--max-new-tokens", "12"]) == 0
    assert capsys.readouterr().out == "\n\n".join(texts) + "\n"

    losses = lm.loss_at(run, ["1x", 48])
    assert list(losses) == [32, 48]
    assert main(["eval", str(root / "run"), "--context-lengths", "1x,48"]) == 0
    rows = json.loads((root / "run" / "eval.json").read_text())["rows"]
    assert {r["context_length"]: r["loss"] for r in rows} == losses


def test_loss_at_warns_what_lm_eval_notes_a_length_longer_than_the_split(tmp_path, capsys):
    text = tmp_path / "short.txt"
    text.write_text("".join(f"line {i} of a short text\n" for i in range(40)), encoding="utf-8")
    data = {"source": str(text), "split_by": "line", "cache_dir": str(tmp_path / "cache")}
    train = {"max_steps": 2, "eval_every": 0, "checkpoint_every": 2}
    config = write_config(tmp_path / "c.yaml", data=data, train=train)
    lm.train(config, tmp_path / "run", quiet=True)
    with pytest.warns(UserWarning) as caught:
        losses = lm.loss_at(tmp_path / "run", ["1x", 1000])
    assert list(losses) == [32, 1000] and all(math.isfinite(v) for v in losses.values())
    [warning] = caught  # 1x has its windows; 1000 tokens is more than the split holds
    message = str(warning.message)
    assert message.startswith("lengths: 1000: no window of the val split reaches 1000 tokens")
    assert main(["eval", str(tmp_path / "run"), "--context-lengths", "1x,1000"]) == 0
    assert message.removeprefix("lengths: ") in capsys.readouterr().out.splitlines()


WRONG = {
    "config": lambda run, d: lm.train(123),
    "run_dir": lambda run, d: lm.load(None),
    "prompts": lambda run, d: lm.generate(run, None),
    "prompt": lambda run, d: lm.view(run, 5),
    "overrides": lambda run, d: lm.train(d / "tiny.yaml", d / "o", overrides=[1]),
    "overrides ": lambda run, d: lm.train(run.config, d / "o", overrides="train.max_steps"),
    "checkpoint": lambda run, d: lm.load(d / "run", checkpoint="step_99"),
    "rope_scaling": lambda run, d: lm.load(d / "run", rope_scaling="big"),
    "init_from": lambda run, d: lm.train(run.config, d / "o", init_from=d / "none"),
    "init_from ": lambda run, d: lm.train(run.config, d / "run", overwrite=True, init_from=d),
    "lengths": lambda run, d: lm.loss_at(run, None),
    "device": lambda run, d: lm.load(d / "run", device=0),
    "q": lambda run, d: lm.attention(None, torch.ones(1, 2), torch.ones(1, 2)),
    "L": lambda run, d: lm.causal_mask(None),
    "key_mask": lambda run, d: lm.attention_mask([[True]]),
    "length": lambda run, d: lm.sinusoids(None, 4),
    "positions": lambda run, d: lm.rope(torch.ones(2, 4), [0, 1]),
    "path": lambda run, d: lm.load_config(123),
    "overrides  ": lambda run, d: lm.load_config(None, "model.n_layer=2"),
    "config ": lambda run, d: lm.TransformerLM(None),
    "config  ": lambda run, d: lm.TransformerLM(lm.load_config().model),
}


@pytest.mark.parametrize("name", list(WRONG))
def test_a_wrong_argument_is_one_line_naming_it_and_no_flag(trained, name):
    root, _ = trained
    run = lm.load(root / "run", device="cpu")
    with pytest.raises(lm.LMError) as e:
        WRONG[name](run, root)
    message = str(e.value)
    assert message.startswith(name.rstrip()) and "\n" not in message and " --" not in message
    assert not (root / "o").exists()


def test_the_notes_formulas_give_the_notes_numbers():
    q = torch.tensor([[1.0]])
    k = torch.tensor([[0.0], [math.log(2)], [math.log(3)]])
    v = torch.tensor([[1.0, 0.0], [0.0, 2.0], [2.0, 2.0]])
    y, a = lm.attention(q, k, v)  # the soft-lookup example
    assert torch.allclose(a, torch.tensor([[1 / 6, 2 / 6, 3 / 6]]))
    assert torch.allclose(y, torch.tensor([[7 / 6, 5 / 3]]))
    M = lm.causal_mask(3)
    assert M.tolist() == [[0, -math.inf, -math.inf], [0, 0, -math.inf], [0, 0, 0]]
    allowed = lm.attention_mask(torch.tensor([[True, True, False]]))
    assert allowed.shape == (1, 1, 3, 3) and allowed[0, 0, :2].tolist() == [
        [True, False, False],
        [True, True, False],
    ]
    p = lm.sinusoids(6, 4)
    assert torch.allclose(
        p[5], torch.tensor([math.sin(5), math.cos(5), math.sin(0.05), math.cos(0.05)])
    )
    x, w = torch.randn(1, 8), torch.randn(1, 8)

    def score(l, s):
        return lm.rope(x, torch.tensor([l])) @ lm.rope(w, torch.tensor([s])).T

    assert torch.allclose(score(1, 3), score(2, 4), atol=1e-5)  # the offset alone
    assert not torch.allclose(score(1, 3), score(1, 4), atol=1e-3)


def test_import_lm_loads_no_torch_and_names_the_api():
    code = "import lm, sys; assert 'torch' not in sys.modules; print(sorted(dir(lm)))"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    for name in ("train", "load", "generate", "loss_at", "attention", "rope", "sinusoids"):
        assert name in done.stdout
    with pytest.raises(AttributeError, match="no attribute 'nothing'"):
        lm.nothing  # noqa: B018


def test_the_tutorial_notebook_runs_and_checks_the_notes_examples(tmp_path):
    import nbclient
    import nbformat

    notebook = nbformat.read(ROOT / "docs" / "tutorial.ipynb", as_version=4)
    stored = [c for c in notebook.cells if c.cell_type == "code"]
    showing = [c for c in stored if "print(" in c.source or "plt.show()" in c.source]
    assert showing and all(c.outputs for c in showing), "the notebook is stored with its outputs"
    # Its tiny run tokenizes into this test's cache, not the user's.
    env = {**os.environ, "LM_CACHE": str(tmp_path / "cache")}
    client = nbclient.NotebookClient(
        notebook, timeout=300, kernel_name="python3", resources={"metadata": {"path": tmp_path}}
    )
    client.execute(env=env)  # every cell asserts what the notes say; an error fails here
    assert not list(tmp_path.glob("*.png")), "the notebook writes nothing beside itself"
