"""lm compare, lm attention, lm positions: a tiny two-scheme sweep end to end on CPU."""

from __future__ import annotations

import hashlib
import json
import math
import shutil
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from _support import expect_error, metrics, write_config
from PIL import Image

from lm.cli import main
from lm.compare.diagnostics import draw_attention, draw_score_by_offset
from lm.compare.measure import MEASURED
from lm.config.load import load_config
from lm.config.names import POSITIONS
from lm.config.sections import ModelConfig
from lm.model.transformer import TransformerLM
from lm.runs.checkpoint import latest_checkpoint

SCHEMES = ("rope", "learned")  # learned has no vector past its trained length: the hard case
PICTURES = ("loss_vs_step.png", "loss_vs_time.png", "loss_vs_context.png")


@pytest.fixture(scope="module")
def sweep(tmp_path_factory):
    root = tmp_path_factory.mktemp("compare")
    cfg = write_config(
        root / "tiny.yaml",
        train={"max_steps": 16, "eval_every": 8, "eval_steps": 2, "checkpoint_every": 8},
    )
    out = root / "sweep"
    argv = [
        "compare",
        str(cfg),
        "--vary",
        f"model.position={','.join(SCHEMES)}",
        "--seeds",
        "1",
        "--set",
        f"data.cache_dir={root / 'cache'}",
        "--out",
        str(out),
        "--max-new-tokens",
        "12",
        "--quiet",
    ]
    assert main(argv) == 0
    runs = {s: out / f"position={s}" / "seed1" for s in SCHEMES}
    return SimpleNamespace(root=root, argv=argv, out=out, runs=runs)


def report_json(sweep) -> dict[str, dict]:
    data = json.loads((sweep.out / "report.json").read_text())
    return {r["label"]: r for r in data["runs"]}


def table_row(out: Path, label: str, width: int = 9) -> list[str]:
    """The cells of ``label``'s row in report.md's table of ``width`` columns: 9 the training
    table, 4 the length table (1x, 2x, 4x), 3 the continuations."""
    rows = [
        [cell.strip() for cell in line.strip().strip("|").split(" | ")]
        for line in (out / "report.md").read_text().splitlines()
        if line.startswith(f"| {label} |")
    ]
    rows = [cells for cells in rows if len(cells) == width]
    assert len(rows) == 1, rows
    return rows[0]


def test_every_run_is_trained_and_the_table_has_one_row_of_finite_numbers_per_scheme(sweep):
    for run in sweep.runs.values():
        assert latest_checkpoint(run).name == "step_00000016"
    numbers = report_json(sweep)
    assert sorted(numbers) == sorted(SCHEMES)
    for scheme, r in numbers.items():
        assert r["step"] == 16 and r["parameters"] > 0
        assert r["tokens_seen"] == 16 * 8 * 32 and r["tokens_exact"]
        for key in ("final_val_loss", "best_val_loss", "tokens_per_s", "wall_s"):
            assert math.isfinite(r[key]) and r[key] > 0, (scheme, key)
        cells = table_row(sweep.out, scheme)
        # final val, best val, 1x context: plain finite numbers with one seed
        for cell in (cells[5], cells[6], table_row(sweep.out, scheme, 4)[1]):
            assert math.isfinite(float(cell))
        assert float(cells[5]) == pytest.approx(r["final_val_loss"], abs=1e-4)
        assert r["continuation"], "the greedy continuation is empty"


def test_pictures_exist_and_decode_as_real_images(sweep):
    markdown = (sweep.out / "report.md").read_text()
    for name in PICTURES:
        with Image.open(sweep.out / name) as image:
            image.verify()
        with Image.open(sweep.out / name) as image:
            width, height = image.size
        assert width > 100 and height > 100, name
        assert f"({name})" in markdown


def test_runs_share_one_tokenizer_and_one_token_id_cache(sweep):
    digests = {
        hashlib.sha256((run / "tokenizer.json").read_bytes()).hexdigest()
        for run in sweep.runs.values()
    }
    assert len(digests) == 1
    cache = sweep.root / "cache"
    assert len(list((cache / "tokenizers").glob("*.json"))) == 1  # trained once
    assert len([p for p in (cache / "data").iterdir() if not p.name.startswith(".")]) == 1
    assert "share one tokenizer" in (sweep.out / "report.md").read_text()


def test_extrapolation_at_2x_runs_for_every_scheme_and_learned_says_why_not(sweep):
    numbers = report_json(sweep)
    for r in numbers.values():
        assert [row["context_length"] for row in r["extrapolation"]] == [32, 64, 128]
    rope_2x = numbers["rope"]["extrapolation"][1]
    assert math.isfinite(rope_2x["loss"])
    learned_2x = numbers["learned"]["extrapolation"][1]
    assert learned_2x["loss"] is None and "learned positions stop at 32" in learned_2x["note"]
    cells = table_row(sweep.out, "learned", 4)
    assert cells[2] == "n/a [1]" and cells[3] == "n/a [1]"
    assert "[1] learned positions stop at 32" in (sweep.out / "report.md").read_text()
    assert math.isfinite(float(table_row(sweep.out, "rope", 4)[2]))


def test_rerun_reuses_finished_runs_and_resumes_an_interrupted_one(sweep):
    rope, learned = sweep.runs["rope"], sweep.runs["learned"]
    rope_weights = latest_checkpoint(rope) / "model.safetensors"
    rope_before = (rope_weights.stat().st_ino, (rope / "metrics.jsonl").read_bytes())
    # An interruption after step 8: the step-16 checkpoint never got written.
    step8, step16 = sorted((learned / "checkpoints").iterdir())
    for f in step16.iterdir():
        f.unlink()
    step16.rmdir()
    step8_inode = (step8 / "model.safetensors").stat().st_ino

    assert main(sweep.argv) == 0
    assert (rope_weights.stat().st_ino, (rope / "metrics.jsonl").read_bytes()) == rope_before
    assert latest_checkpoint(learned).name == "step_00000016"
    assert (step8 / "model.safetensors").stat().st_ino == step8_inode  # resumed, not restarted
    steps = [m["step"] for m in metrics(learned) if "train_loss" in m]
    assert steps == sorted(set(steps)) and steps[-1] == 16


def test_attention_rows_sum_to_one_with_zeros_above_the_diagonal(sweep, tmp_path):
    picture = draw_attention(sweep.runs["rope"], "for x in y:", out=tmp_path / "all.png")
    w = picture.weights
    assert w.shape == (2, 11, 11) and picture.layer == 1
    np.testing.assert_allclose(w.sum(axis=-1), 1.0, atol=1e-5)
    future = np.triu(np.ones((11, 11), dtype=bool), k=1)
    assert np.all(w[:, future] == 0.0) and np.all(w[:, ~future] > 0.0)

    out = tmp_path / "one.png"
    args = ["--layer", "0", "--head", "1", "--out", str(out)]
    assert main(["attention", str(sweep.runs["learned"]), "--text", "def f(x):", *args]) == 0
    with Image.open(out) as image:
        assert min(image.size) > 100


@pytest.mark.parametrize("position", POSITIONS)
def test_the_scores_averaged_by_offset_are_what_the_softmax_sees(position):
    # The pictures' S + M, through softmax, are the weights the model's own forward pass (fused
    # kernel) used: A V, through W_O, gives each layer's actual output.
    torch.manual_seed(0)
    cfg = ModelConfig(
        vocab_size=40, context_length=16, n_layer=2, n_head=2, d_model=16, position=position
    )
    model = TransformerLM(cfg).eval()
    ids = torch.randint(0, 40, (3, 16))
    seen = []
    hooks = [
        b.attn.register_forward_hook(lambda m, args, y: seen.append((args[0], y)))
        for b in model.blocks
    ]
    with torch.no_grad():
        model(ids)
    for hook in hooks:
        hook.remove()
    future = torch.ones(16, 16, dtype=torch.bool).triu(1)
    maps = model.attention_weights(ids)
    for block, (scores, weights), (x, y) in zip(model.blocks, maps, seen, strict=True):
        assert torch.isinf(scores[..., future]).all() and torch.isfinite(scores[..., ~future]).all()
        v = block.attn.project(x)[2]  # (B, H, T, d_k)
        ours = block.attn.out((weights @ v).transpose(1, 2).flatten(2))
        torch.testing.assert_close(ours, y, rtol=1e-5, atol=1e-6)


def test_position_pictures(sweep, tmp_path):
    table = tmp_path / "sinusoids.png"
    assert main(["positions", "--d", "4", "--length", "16", "--out", str(table)]) == 0
    profile, path = draw_score_by_offset(sweep.runs["rope"], tmp_path / "offsets.png", windows=4)
    assert profile.shape == (2, 2, 32) and np.isfinite(profile).all()
    for picture in (table, path):
        with Image.open(picture) as image:
            assert min(image.size) > 100


@pytest.mark.parametrize(
    "args, message",
    [
        (["--vary", "model.position"], "expected KEY=VALUE,VALUE,..."),
        (["--vary", "model.heads=1,2"], "model.heads: unknown key"),
        (["--vary", "model.position=rope,spiral"], "model.position: 'spiral' is not one of"),
        (["--vary", "train.seed=1,2"], "use --seeds"),
        ([], "a sweep needs --vary"),
        (["--vary", "eval.rope_scaling=spiral:4"], "--vary eval.rope_scaling: 'spiral:4' is not"),
        (["--vary", "eval.rope_scaling=none,pi:0"], "the factor of 'pi:0' must be a number >= 1"),
        (["--vary", "eval.rope_scaling=ntk:x"], "the factor of 'ntk:x' is not a number"),
        (["--vary", "eval.temperature=1,2"], "--vary eval.temperature: unknown evaluation key"),
        (
            ["--vary", "model.position=alibi,none", "--vary", "eval.rope_scaling=pi:4"],
            "none of the runs uses position: rope",
        ),
        (["--set", "model.position=alibi", "--rope-scaling", "yarn:4"], "position: rope"),
        (
            ["--vary", "model.position=rope", "--vary", "model.n_layer=1,2"],
            "a sweep varies one training key",
        ),
        (
            ["--vary", "eval.rope_scaling=none", "--rope-scaling", "pi:4"],
            "--rope-scaling and --vary eval.rope_scaling: give one of them",
        ),
        (["--vary", "model.position=rope", "--eval-lengths", "1.5"], "list of lengths"),
    ],
)
def test_a_bad_sweep_is_one_line_exit_2_and_trains_nothing(args, message, tmp_path, capsys):
    cfg = write_config(tmp_path / "c.yaml")
    expect_error(capsys, ["compare", str(cfg), "--out", str(tmp_path / "out"), *args], message)
    assert not (tmp_path / "out").exists()


def test_a_per_layer_position_is_swept_with_a_readable_label_and_folder(tmp_path):
    from lm.config.load import load_config

    cfg = write_config(tmp_path / "c.yaml", train={"max_steps": 2, "eval_every": 0})
    out = tmp_path / "out"
    vary = "model.position=rope,[rope,none]"  # the list's commas stay inside its brackets
    args = ["--eval-lengths", "1x", "--eval-batches", "1", "--max-new-tokens", "2", "--quiet"]
    cache = f"data.cache_dir={tmp_path / 'cache'}"
    assert (
        main(["compare", str(cfg), "--vary", vary, "--set", cache, "--out", str(out), *args]) == 0
    )
    hybrid = out / "position=rope,none" / "seed7"  # no shell pattern in the folder's name
    assert load_config(hybrid / "config.yaml").model.layer_positions == ("rope", "none")
    assert table_row(out, "[rope, none]")[0] == "[rope, none]"
    assert table_row(out, "rope")[0] == "rope"


@pytest.mark.parametrize(
    "argv, message",
    [
        (["compare", "{tmp}"], "not a run directory and holds none"),
        (["compare", "{tmp}/nowhere"], "no such run directory"),
        (["attention", "{tmp}", "--text", "x"], "not a run directory"),
        (["positions", "{tmp}"], "not a run directory"),
    ],
)
def test_a_folder_that_is_not_a_run_is_one_line_exit_2(argv, message, tmp_path, capsys):
    expect_error(capsys, [a.replace("{tmp}", str(tmp_path)) for a in argv], message)


def test_report_only_from_run_folders(sweep, tmp_path, capsys):
    runs = [str(sweep.runs[s]) for s in SCHEMES]
    assert main(["compare", *runs, "--out", str(tmp_path), "--quiet", "--eval-batches", "1"]) == 0
    printed = capsys.readouterr().out
    assert printed.strip() == (tmp_path / "report.md").read_text().strip()
    assert "first 1 batches" in printed
    assert all(Path(tmp_path / name).is_file() for name in PICTURES)


def test_an_evaluation_only_vary_measures_the_same_runs_without_retraining(sweep, tmp_path):
    from lm.evaluate import evaluate_run

    out = tmp_path / "sweep"
    shutil.copytree(sweep.out, out)  # copy2: the files keep their times

    def record() -> dict[Path, tuple[int, int]]:
        files = [*out.glob("*/seed*/checkpoints/*/*"), *out.glob("*/seed*/metrics.jsonl")]
        return {f: (f.stat().st_mtime_ns, f.stat().st_size) for f in files}

    before = record()
    assert len(before) > 4  # both runs: checkpoint files and metrics
    argv = [a if a != str(sweep.out) else str(out) for a in sweep.argv]
    methods = "none,pi:4,ntk:4,yarn:4"
    argv += ["--vary", f"eval.rope_scaling={methods}", "--eval-lengths", "1x,1.5x,2x"]
    assert main(argv) == 0
    assert record() == before  # nothing trained, resumed or saved
    assert sorted(p.parent.parent.name for p in out.glob("*/seed*/config.yaml")) == [
        "position=learned",
        "position=rope",
    ]
    data = json.loads((out / "report.json").read_text())
    labels = ["rope", "rope + pi:4", "rope + ntk:4", "rope + yarn:4", "learned"]
    assert [r["label"] for r in data["runs"]] == labels
    assert [r["rope_scaling"] for r in data["runs"]] == [None, "pi:4", "ntk:4", "yarn:4", None]
    assert table_row(out, "position", 4) == [
        "position",
        "val loss @32 (1×)",
        "val loss @48 (1.5×)",
        "val loss @64 (2×)",
    ]
    # Each row is what lm eval measures with that extension on the same run.
    rope = out / "position=rope" / "seed1"
    for label in labels[:4]:
        method = label.partition(" + ")[2] or None
        cells = table_row(out, label, 4)
        rows = evaluate_run(rope, ["1x", "1.5x", "2x"], rope_scaling=method)["rows"]
        assert cells[1:] == [f"{row['loss']:.4f}" for row in rows], label
    assert table_row(out, "learned", 4)[2:] == ["n/a [1]", "n/a [1]"]
    # The training table lists each trained run once.
    assert table_row(out, "rope")[1] == table_row(out, "learned")[1] == "1"
    assert "| rope + pi:4 | 1 | 28," not in (out / "report.md").read_text()
    with Image.open(out / "loss_vs_context.png") as image:
        assert min(image.size) > 100


def test_an_evaluation_time_extension_of_a_run_without_rope_is_refused(sweep, capsys):
    learned = str(sweep.runs["learned"])
    for argv in (
        ["eval", learned, "--rope-scaling", "pi:4"],
        ["sample", learned, "--prompt", "x", "--rope-scaling", "yarn:2"],
    ):
        expect_error(capsys, argv, "extends RoPE; this run uses position: learned")
    expect_error(
        capsys,
        ["compare", learned, "--vary", "eval.rope_scaling=pi:4", "--out", str(sweep.root / "x")],
        "none of the runs uses position: rope",
    )


def test_one_config_evaluated_with_each_extension_needs_no_training_vary(sweep, tmp_path):
    out = tmp_path / "one"
    shutil.copytree(sweep.runs["rope"], out / "seed1")  # the run this config trains, finished
    state = (out / "seed1" / "metrics.jsonl").read_bytes()
    cfg = sweep.argv[1]
    argv = ["compare", cfg, "--vary", "eval.rope_scaling=none,ntk:2", "--seeds", "1", "--quiet"]
    cache = f"data.cache_dir={sweep.root / 'cache'}"
    assert main([*argv, "--set", cache, "--out", str(out), "--max-new-tokens", "4"]) == 0
    assert (out / "seed1" / "metrics.jsonl").read_bytes() == state  # reused, not retrained
    assert list(out.glob("*/config.yaml")) == [out / "seed1" / "config.yaml"]
    markdown = (out / "report.md").read_text()
    assert markdown.startswith("# Runs compared by rope_scaling\n")
    assert table_row(out, "none", 4)[0] == "none" and table_row(out, "ntk:2", 4)[0] == "ntk:2"


def test_a_rebuilt_report_is_the_same_report(sweep, tmp_path, capsys):
    """``lm compare SWEEP_DIR`` rebuilds the report the sweep wrote: the same runs in the same
    order, evaluated with the sweep's extensions, lengths, batches, prompt and length."""
    out = tmp_path / "sweep"
    shutil.copytree(sweep.out, out)
    argv = [a if a != str(sweep.out) else str(out) for a in sweep.argv]
    argv += ["--vary", "eval.rope_scaling=none,ntk:4", "--eval-lengths", "1x,2x"]
    argv += ["--eval-batches", "2", "--prompt", "def f", "--max-new-tokens", "6"]
    assert main(argv) == 0
    written = {name: (out / name).read_bytes() for name in ("report.md", "report.json")}
    labels = [r["label"] for r in json.loads(written["report.json"])["runs"]]
    assert labels == ["rope", "rope + ntk:4", "learned"]
    for name in written:
        (out / name).unlink()
    capsys.readouterr()
    assert main(["compare", str(out), "--quiet"]) == 0
    assert capsys.readouterr().out.strip() == written["report.md"].decode().strip()
    assert {name: (out / name).read_bytes() for name in written} == written
    # A flag given to the rebuild still says what it asks for.
    assert main(["compare", str(out), "--quiet", "--eval-lengths", "1x"]) == 0
    assert table_row(out, "position", 2) == ["position", "val loss @32 (1×)"]


def test_a_vary_value_joins_other_settings_of_its_runs_with_a_plus(tmp_path, capsys):
    # Stick-breaking is position none with another normalisation: one value of one sweep.
    cfg = write_config(tmp_path / "tiny.yaml", train={"max_steps": 2, "eval_every": 0})
    out = tmp_path / "sweep"
    cache = f"data.cache_dir={tmp_path / 'cache'}"
    joined = "none+model.normalize=stick_breaking"
    argv = ["compare", str(cfg), "--vary", f"model.position=rope,{joined}", "--set", cache]
    assert main([*argv, "--out", str(out), "--max-new-tokens", "2", "--quiet"]) == 0
    capsys.readouterr()
    (run,) = (out / "position=none+normalize=stick_breaking").glob("seed*")
    model = load_config(run / "config.yaml").model
    assert (model.position, model.normalize) == ("none", "stick_breaking")
    rows = [r["label"] for r in json.loads((out / "report.json").read_text())["runs"]]
    assert rows == ["position=rope, normalize=softmax", "position=none, normalize=stick_breaking"]
    # Refused before any training, in one line naming --vary: a key set twice, a key that
    # does not exist, a value that is another value's setting.
    for values, message in [
        (
            "rope,none+model.position=rope",
            "--vary model.position: 'none+model.position=rope' sets model.position twice",
        ),
        ("rope,none+model.nrmlz=ssmax", "model.nrmlz: unknown key (did you mean model.normalize?)"),
        (
            "rope,rope+model.normalize=softmax",
            "--vary model.position: rope and rope+model.normalize=softmax are the same setting",
        ),
    ]:
        bad = tmp_path / "bad"
        argv = ["compare", str(cfg), "--vary", f"model.position={values}", "--set", cache]
        expect_error(capsys, [*argv, "--out", str(bad)], message)
        assert not bad.exists()


def test_a_report_reads_back_what_was_measured_with_the_same_settings(sweep, tmp_path, capsys):
    """Each run keeps its measurement (measured.json) under the settings and checkpoint that
    made it: a rebuild with the same ones reads it back, other settings, another checkpoint or
    a damaged file measure anew, and the report is the same report either way."""
    out = tmp_path / "sweep"
    shutil.copytree(sweep.out, out)
    rope = out / "position=rope" / "seed1"
    kept = (rope / MEASURED).read_text()
    capsys.readouterr()
    assert main(["compare", str(out)]) == 0
    said = capsys.readouterr().err
    assert "evaluating" not in said and "2 of 2 measurement(s) read back" in said
    assert (rope / MEASURED).read_text() == kept
    report = (out / "report.json").read_text()

    (rope / MEASURED).write_text("{not json")  # damaged: measured again, the same numbers
    assert main(["compare", str(out)]) == 0
    said = capsys.readouterr().err
    assert f"evaluating {rope}" in said and "1 of 2 measurement(s) read back" in said
    assert (out / "report.json").read_text() == report

    assert main(["compare", str(out), "--max-new-tokens", "3"]) == 0  # another setting
    said = capsys.readouterr().err
    assert f"evaluating {rope}" in said and "read back" not in said
    assert len(json.loads((rope / MEASURED).read_text())["entries"]) == 2

    checkpoint = latest_checkpoint(rope) / "model.safetensors"
    checkpoint.write_bytes(checkpoint.read_bytes())  # another checkpoint file: measured anew
    assert main(["compare", str(out), "--max-new-tokens", "3"]) == 0
    assert f"evaluating {rope}" in capsys.readouterr().err
