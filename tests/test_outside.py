"""A position scheme written outside lm (docs/positions.md, "Your own scheme") gets what a builtin
gets: training bit for bit as its base, resume, the KV cache, sample, eval, view, hybrids; its
run keeps a copy of its code, imported only with --trust-code; bad files are one line."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest
import torch
from _support import assert_same_weights, expect_error, losses, tiny_config, write_config

import lm
from lm.cli import main
from lm.config import names, outside
from lm.config.errors import LMError
from lm.model.schemes import SCHEME_CLASSES
from lm.model.transformer import TransformerLM

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = {
    "alibi": ROOT / "examples" / "alibi_learned_slopes.py",
    "rope": ROOT / "examples" / "rope_learned_frequencies.py",
}
CLASSES = {"alibi": "LearnedSlopes", "rope": "LearnedFrequencies"}


def another_process() -> None:
    """As a fresh process: no outside scheme loaded."""
    outside._LOADED.clear()
    names.OUTSIDE.clear()
    for name in [m for m in sys.modules if m.startswith("_lm_scheme_")]:
        del sys.modules[name]


@pytest.fixture(autouse=True)
def forget():
    yield
    another_process()


def train(root: Path, position, out: str = "run", **train) -> Path:
    cfg = write_config(
        root / f"{out}.yaml",
        model={"position": position},
        data={"cache_dir": str(root.parent / "cache")},
        train={"max_steps": 10, "checkpoint_every": 5, **train},
    )
    assert main(["train", str(cfg), "--out", str(root / out), "--quiet"]) == 0
    return root / out


def test_every_builtin_class_is_in_lm_schemes():
    assert {name: getattr(lm.schemes, cls.__name__) for name, cls in SCHEME_CLASSES.items()} == {
        name: cls for name, cls in SCHEME_CLASSES.items()
    }
    assert lm.Scheme is lm.schemes.Scheme and lm.ScoreBias is lm.schemes.ScoreBias


def test_a_subclass_of_alibi_changing_nothing_trains_as_alibi_bit_for_bit(tmp_path):
    (tmp_path / "mine.py").write_text("import lm\n\nclass Mine(lm.schemes.ALiBi):\n    pass\n")
    builtin = train(tmp_path, "alibi", "alibi")
    mine = train(tmp_path, str(tmp_path / "mine.py") + ":Mine", "mine")
    assert losses(mine) == losses(builtin)
    assert_same_weights(mine, builtin)
    record = json.loads((mine / "run.json").read_text())["schemes"][0]
    assert record["spec"] == f"{tmp_path / 'mine.py'}:Mine"
    assert (mine / record["copy"]).read_bytes() == (tmp_path / "mine.py").read_bytes()


@pytest.mark.parametrize("base", ["alibi", "rope"])
def test_each_example_starts_as_its_builtin_and_decodes_with_the_cache(base):
    spec = f"{EXAMPLES[base]}:{CLASSES[base]}"
    ours, theirs = (tiny_config(model={"position": p, "vocab_size": 40}) for p in (spec, base))
    torch.manual_seed(0)
    a = TransformerLM(ours.model).eval()
    torch.manual_seed(0)
    b = TransformerLM(theirs.model).eval()
    assert sum(p.numel() for p in a.parameters()) > sum(p.numel() for p in b.parameters())
    ids = torch.randint(0, 40, (2, 20))
    with torch.no_grad():
        torch.testing.assert_close(a(ids), b(ids), rtol=1e-5, atol=1e-5)
    from lm.sample import generate

    prompts = [[1, 2, 3, 4], [5, 6]]
    with_cache = generate(a, prompts, 12, pad_id=0, use_cache=True)
    assert with_cache == generate(a, prompts, 12, pad_id=0, use_cache=False)


@pytest.mark.parametrize("base", ["alibi", "rope"])
def test_each_example_trains_and_resumes_exactly(tmp_path, base):
    spec = f"{EXAMPLES[base]}:{CLASSES[base]}"
    whole = train(tmp_path, spec, "whole")
    cut = train(tmp_path, spec, "cut", max_steps=5)
    cfg = write_config(
        tmp_path / "cut.yaml",
        model={"position": spec},
        data={"cache_dir": str(tmp_path.parent / "cache")},
        train={"max_steps": 10, "checkpoint_every": 5},
    )
    assert main(["train", str(cfg), "--out", str(cut), "--resume", "--quiet"]) == 0
    assert losses(cut) == losses(whole)
    assert_same_weights(cut, whole)
    first, last = losses(whole)[min(losses(whole))], losses(whole)[max(losses(whole))]
    assert last < first


def test_gradient_accumulation_and_a_hybrid_train_as_a_builtin_does(tmp_path):
    spec = f"{EXAMPLES['alibi']}:LearnedSlopes"
    one = train(tmp_path, ["rope", spec], "one", batch_size=8)
    two = train(tmp_path, ["rope", spec], "two", batch_size=8, grad_accum=2)
    for step, loss in losses(one).items():
        assert losses(two)[step] == pytest.approx(loss, rel=1e-4)


def test_another_persons_run_runs_none_of_its_code_without_trust(tmp_path, capsys):
    marker = tmp_path / "marker"
    source = tmp_path / "theirs.py"
    source.write_text(
        f"from pathlib import Path\nPath({str(marker)!r}).write_text('ran')\n"
        "import lm\n\nclass Theirs(lm.schemes.ALiBi):\n    pass\n"
    )
    run = train(tmp_path, f"{source}:Theirs")
    source.unlink(), marker.unlink()
    another_process()  # another person's machine
    for argv in (
        ["sample", str(run), "--prompt", "ab", "--max-new-tokens", "2"],
        ["eval", str(run), "--max-batches", "1"],
        ["view", str(run), "--prompt", "ab", "--out", str(tmp_path / "v.html")],
        ["export", str(run), "--out", str(tmp_path / "hf")],
    ):
        err = expect_error(capsys, argv, str(run))
        assert "--trust-code" in err or "cannot be exported" in err, err
        assert not marker.exists(), argv
    with pytest.raises(LMError, match="trust-code"):
        lm.load(run)
    assert not marker.exists()
    loaded = lm.load(run, trust_code=True)  # its copy, though the file is gone
    assert marker.exists() and loaded.step == 10
    assert "is gone" in capsys.readouterr().err
    assert main(["eval", str(run), "--context-lengths", "1x,2x", "--trust-code"]) == 0
    assert (
        main(["sample", str(run), "--prompt", "ab", "--max-new-tokens", "3", "--trust-code"]) == 0
    )
    html = tmp_path / "v.html"
    assert main(["view", str(run), "--prompt", "ab", "--out", str(html), "--trust-code"]) == 0
    assert html.stat().st_size > 1000


def test_a_resume_refuses_a_changed_file(tmp_path, capsys):
    (tmp_path / "mine.py").write_text("import lm\n\nclass Mine(lm.schemes.ALiBi):\n    pass\n")
    run = train(tmp_path, f"{tmp_path / 'mine.py'}:Mine", max_steps=5)
    (tmp_path / "mine.py").write_text(
        "import lm\n\nclass Mine(lm.schemes.ALiBi):\n    one_bias = False\n"
    )
    another_process()
    cfg = tmp_path / "run.yaml"
    expect_error(capsys, ["train", str(cfg), "--out", str(run), "--resume"], "changed since")


BAD = {
    "missing file": ("", "nothere.py:X", "no such file"),
    "missing class": ("import lm\n", "f.py:X", "has no class X"),
    "not a scheme": ("class X:\n    pass\n", "f.py:X", "is not a position scheme"),
    "no row": ("import lm\nclass X(lm.Scheme):\n    pass\n", "f.py:X", "declares no row"),
    "rope keys on scores": (
        "import lm\nclass X(lm.Scheme):\n    row = lm.SchemeRow(place=lm.Place.SCORES, "
        "keys=('rope_base', 'rope_scaling'))\n",
        "f.py:X",
        "reads rope_base",
    ),
    "learned bias off the scores": (
        "import lm\nclass X(lm.Scheme):\n    row = lm.SchemeRow(place=lm.Place.EMBEDDINGS, "
        "learned_bias=True)\n",
        "f.py:X",
        "learned_bias",
    ),
    "even naming no key": (
        "import lm\nclass X(lm.Scheme):\n    row = lm.SchemeRow(place=lm.Place.SCORES, "
        "even=('head_width',))\n",
        "f.py:X",
        "head_width",
    ),
    "a builtin's name": (
        "import lm\nclass X(lm.schemes.RoPE):\n    name = 'rope'\n",
        "f.py:X",
        "'rope'",
    ),
    "no module": ("", "no_such_module_here:X", "no module"),
}


@pytest.mark.parametrize("case", BAD)
def test_a_bad_scheme_is_one_line_naming_it(tmp_path, monkeypatch, capsys, case):
    text, spec, words = BAD[case]
    monkeypatch.chdir(tmp_path)
    (tmp_path / "f.py").write_text(text)
    cfg = write_config(tmp_path / "c.yaml", model={"position": ["rope", spec]})
    expect_error(capsys, ["train", str(cfg), "--out", str(tmp_path / "r")], words)
    assert not (tmp_path / "r").exists()


def test_a_scheme_that_raises_shows_its_own_frames_and_not_lms(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "boom.py").write_text(
        "import lm\n\ndef go():\n    raise ValueError('boom')\n\ngo()\n"
    )
    (tmp_path / "late.py").write_text(
        "import lm\n\nclass Late(lm.schemes.ALiBi):\n    def arguments(self, where):\n"
        "        raise RuntimeError('late')\n"
    )
    for name, words in (("boom.py:X", "ValueError"), ("late.py:Late", "RuntimeError: late")):
        cfg = write_config(tmp_path / "c.yaml", model={"position": name}, train={"max_steps": 2})
        code = main(["train", str(cfg), "--out", str(tmp_path / name.split(".")[0]), "--quiet"])
        err = capsys.readouterr().err
        assert code == 2 and words in err and name.split(":")[0] in err, err
        assert "lm/model" not in err and "lm/config" not in err and "Traceback" not in err, err
        assert err.strip().splitlines()[-1].startswith("lm: error:"), err


def test_compare_sweeps_a_file_beside_a_builtin(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    shutil.copy(EXAMPLES["alibi"], tmp_path / "slopes.py")
    cfg = write_config(
        tmp_path / "c.yaml", data={"cache_dir": str(tmp_path / "cache")}, train={"max_steps": 4}
    )
    argv = ["compare", str(cfg), "--vary", "model.position=alibi,./slopes.py:LearnedSlopes"]
    argv += ["--out", str(tmp_path / "sweep"), "--eval-batches", "1", "--quiet"]
    assert main(argv) == 0, capsys.readouterr().err
    report = capsys.readouterr().out
    assert "slopes.py" in report
    folders = sorted(p.name for p in (tmp_path / "sweep").iterdir() if p.is_dir())
    assert len([f for f in folders if "alibi" in f or "slopes" in f]) == 2, folders
