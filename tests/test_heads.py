"""Head scores (lm/evaluate_heads.py): planted attention patterns give their known scores, the
probe is a function of the run, the scores reach metrics.jsonl and TensorBoard without moving
the training numbers, and ``lm heads`` reads any run's checkpoints, refusing bad input in one
line."""

from __future__ import annotations

import importlib.util
import json
import math
import sys
from pathlib import Path

import pytest
import torch
import yaml
from _support import (
    assert_one_line,
    assert_same_weights,
    expect_error,
    metrics,
    tiny_config,
)

import lm
from lm.cli import main
from lm.config.sections import ModelConfig
from lm.data.tokenizer import train_tokenizer
from lm.evaluate_heads import (
    ICL_WINDOWS,
    PROBE_SEQUENCES,
    SCORES,
    head_scores,
    icl_bands,
    icl_score,
    pattern_scores,
    probe,
)
from lm.model.transformer import TransformerLM
from lm.training.board import scalars
from lm.training.loop import train

ROOT = Path(__file__).resolve().parents[1]
N = 8  # tokens per copy in the planted patterns: the probe is 2N long


def planted(keys) -> torch.Tensor:
    """One head's weights ``[1, 1, 2N, 2N]`` with all of query i's weight on key ``keys(i)``
    (query 0 reads itself)."""
    weights = torch.zeros(1, 1, 2 * N, 2 * N)
    for i in range(2 * N):
        weights[0, 0, i, keys(i) if i else 0] = 1.0
    return weights


def scores_of(weights: torch.Tensor) -> dict[str, float]:
    return {name: value.item() for name, value in pattern_scores(weights, N).items()}


def test_a_previous_token_head_scores_one_there_and_nothing_for_induction():
    got = scores_of(planted(lambda i: i - 1))
    assert got["previous_token"] == 1.0
    assert got["induction"] == got["duplicate_token"] == 0.0
    assert got["first_token"] == pytest.approx(1 / (2 * N - 1))  # query 1's previous is token 0


def test_a_planted_induction_head_reads_the_token_after_the_earlier_copy():
    # The first copy has no earlier copy: its queries read the first token, which no score of
    # the second copy counts.
    got = scores_of(planted(lambda i: i - N + 1 if i >= N else 0))
    assert got["induction"] == 1.0
    assert got["duplicate_token"] == 0.0
    assert got["previous_token"] == pytest.approx(1 / (2 * N - 1))  # query 1 reads token 0


def test_a_duplicate_head_and_a_sink_score_one_on_their_own():
    assert scores_of(planted(lambda i: i - N if i >= N else 0))["duplicate_token"] == 1.0
    sink = scores_of(planted(lambda i: 0))
    assert sink["first_token"] == 1.0 and sink["induction"] == 0.0
    # Token 0 is query 1's previous token and query N's earlier copy.
    assert sink["previous_token"] == pytest.approx(1 / (2 * N - 1))
    assert sink["duplicate_token"] == pytest.approx(1 / N)


def test_uniform_attention_scores_the_mean_of_one_over_the_keys():
    T = 2 * N
    weights = torch.tril(torch.ones(T, T)) / torch.arange(1, T + 1)[:, None]
    got = scores_of(weights[None, None])
    spread = sum(1 / (i + 1) for i in range(1, T)) / (T - 1)
    assert got["previous_token"] == pytest.approx(spread)
    assert got["first_token"] == pytest.approx(spread)
    assert got["induction"] == pytest.approx(sum(1 / (i + 1) for i in range(N, T)) / N)


@pytest.fixture(scope="module")
def char_tokenizer():
    return train_tokenizer("char", ["the quick brown fox jumps over the lazy dog 0123456789"])


def test_the_probe_is_the_same_twice_and_each_row_is_one_copy_written_twice(char_tokenizer):
    tok = char_tokenizer
    ids = probe(tok, 32, seed=3)
    assert torch.equal(ids, probe(tok, 32, seed=3))
    assert not torch.equal(ids, probe(tok, 32, seed=4))
    assert ids.shape == (PROBE_SEQUENCES, 32)
    first, second = ids[:, :16], ids[:, 16:]
    assert torch.equal(first, second)
    for row in first.tolist():
        assert len(set(row)) == 16  # no token twice in a copy: one earlier copy per query
        assert not {tok.pad_id, tok.eod_id, tok.unk_id} & set(row)
    # A vocabulary smaller than half the context: each copy holds every ordinary token once.
    short = probe(tok, 1000, seed=3)
    assert short.shape[1] == 2 * (tok.vocab_size - 3)


def test_a_context_too_short_for_a_probe_is_one_line(char_tokenizer):
    with pytest.raises(lm.LMError) as e:
        probe(char_tokenizer, 3, seed=0)
    assert_one_line(e, "3-token context")


def small_model(**model) -> TransformerLM:
    torch.manual_seed(0)
    settings = {"vocab_size": 40, "context_length": 16, "n_layer": 2, "n_head": 2, "d_model": 16}
    return TransformerLM(ModelConfig(**{**settings, **model}))


def test_scoring_draws_no_global_randomness_and_any_kernel_gives_the_explicit_weights():
    ids = torch.randint(3, 40, (PROBE_SEQUENCES, 8)).repeat(1, 2)
    model = small_model(random_positions=64, random_positions_eval=True, kernel="sdpa")
    before = torch.get_rng_state()
    got = head_scores(model, ids, seed=1)
    assert torch.equal(torch.get_rng_state(), before)
    assert got == head_scores(model, ids, seed=1)  # the drawn positions come from the seed
    assert [len(got[s]) for s in SCORES] == [2] * 4 and len(got["induction"][0]) == 2
    explicit = small_model(random_positions=64, random_positions_eval=True, kernel="math")
    explicit.load_state_dict(model.state_dict())
    assert head_scores(explicit, ids, seed=1) == got


class _CopiesEarly(torch.nn.Module):
    """Predicts the next token of a packed window exactly in the first half of its positions
    and knows nothing (uniform logits) in the second: an in-context learning score of ln V."""

    def __init__(self, vocab: int):
        super().__init__()
        self.vocab, self.weight = vocab, torch.nn.Parameter(torch.zeros(1))
        self.rows = 0

    def forward(self, input_ids, **_):
        B, T = input_ids.shape
        self.rows += B
        logits = torch.zeros(B, T, self.vocab)
        nxt = torch.nn.functional.one_hot(input_ids[:, 1:], self.vocab).float()
        logits[:, : T // 2] = 100.0 * nxt[:, : T // 2]
        return logits


def test_the_icl_score_is_the_late_band_minus_the_early_one(tmp_path):
    assert icl_bands(100) == (range(5, 15), range(90, 100))
    assert icl_bands(5) == (range(0, 1), range(4, 5))
    from lm.data.sources import prepare_data

    # An evaluation batch of 100 windows: the score still reads its 16, no more.
    cfg = tiny_config(data={"cache_dir": str(tmp_path)}, train={"eval_batch_size": 100})
    data = prepare_data(cfg.data, log=None)
    vocab = data.tokenizer.vocab_size
    model = _CopiesEarly(vocab)
    got = icl_score(model, cfg, data.val, data.tokenizer.pad_id, torch.device("cpu"))
    assert got == pytest.approx(math.log(vocab), abs=1e-3)
    assert model.rows == ICL_WINDOWS


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Two tiny runs, the same but for train.head_scores; the second's config.yaml written as
    before the key existed."""
    root = tmp_path_factory.mktemp("heads")
    data = {"cache_dir": str(root / "cache")}
    made = {}
    for scored in (True, False):
        train_ = {"head_scores": scored, "tensorboard": scored}
        # Dropout draws from the global stream: a score that moved it would move the losses.
        cfg = tiny_config(model={"dropout": 0.1}, data=data, train=train_)
        made[scored] = root / str(scored)
        train(cfg, made[scored], quiet=True)
    old = made[False] / "config.yaml"
    text = yaml.safe_load(old.read_text())
    del text["train"]["head_scores"]
    old.write_text(yaml.safe_dump(text))
    return made


def test_each_evaluation_logs_every_heads_scores_and_the_icl_score(runs):
    evaluations = [r for r in metrics(runs[True]) if "val_loss" in r]
    assert [r["step"] for r in evaluations] == [15, 30]
    for record in evaluations:
        assert set(record["heads"]) == set(SCORES)
        for table in record["heads"].values():
            assert len(table) == 2 and all(len(row) == 2 for row in table)
            assert all(0.0 <= v <= 1.0 for row in table for v in row)
        assert isinstance(record["icl_score"], float)
    assert not any("heads" in r for r in metrics(runs[False]))


def test_the_board_holds_each_heads_score_at_each_evaluation(runs):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    board = EventAccumulator(str(runs[True]), size_guidance={"scalars": 0})
    board.Reload()
    last = [r for r in metrics(runs[True]) if "heads" in r][-1]
    induction = board.Scalars("heads/induction/L1H0")
    assert [e.step for e in induction] == [15, 30]
    assert induction[-1].value == pytest.approx(last["heads"]["induction"][1][0])
    assert [e.step for e in board.Scalars("icl_score")] == [15, 30]
    assert ("heads/first_token/L0H1", 0.5) in scalars(
        {"step": 1, "heads": {"first_token": [[0.1, 0.5]]}}
    )


def test_logging_the_scores_leaves_the_training_numbers_as_they_were(runs):
    with_scores, without = metrics(runs[True]), metrics(runs[False])
    for key in ("train_loss", "val_loss", "grad_norm"):
        assert [r.get(key) for r in with_scores] == [r.get(key) for r in without], key
    assert_same_weights(runs[True], runs[False])


def test_lm_heads_reads_a_run_trained_before_the_scores_existed(runs, capsys):
    assert main(["heads", str(runs[False]), "--device", "cpu"]) == 0
    out = capsys.readouterr().out
    assert "| layer | head | previous token | induction | duplicate token | first token |" in out
    assert len([line for line in out.splitlines() if line.startswith("| 1 | 1 |")]) == 1
    assert "in-context learning score:" in out and "step 30" in out


def test_lm_heads_json_at_a_step_matches_what_training_logged(runs, capsys):
    assert main(["heads", str(runs[True]), "--step", "30", "--json", "--device", "cpu"]) == 0
    result = json.loads(capsys.readouterr().out)
    logged = [r for r in metrics(runs[True]) if "heads" in r][-1]
    assert result["step"] == 30 and result["checkpoint"].endswith("step_00000030")
    assert result["scores"] == logged["heads"]
    assert result["icl_score"] == logged["icl_score"]
    assert result["probe"] == {"sequences": PROBE_SEQUENCES, "copy": 16, "seed": 7}
    assert lm.heads(runs[True], step=30, device="cpu")["scores"] == logged["heads"]


def test_bad_input_is_one_line(runs, tmp_path, capsys):
    expect_error(capsys, ["heads", str(runs[True]), "--step", "7"], "--step 7", "20, 30")
    expect_error(capsys, ["heads", str(tmp_path)], "not a run directory")
    expect_error(capsys, ["heads", str(tmp_path / "nowhere")], "no such run directory")
    expect_error(capsys, ["heads", str(runs[True]), "--step", "x"], "--step")
    with pytest.raises(lm.LMError) as e:
        lm.heads(runs[True], step=-1, device="cpu")
    assert_one_line(e, "step")
    with pytest.raises(lm.LMError) as e:
        lm.heads(runs[True], step=11, device="cpu")
    assert_one_line(e, "step 11", "20, 30")


# ---------------------------------------------------------------------------------------------
# scripts/induction.py: the formation step read from what training logged


def _script():
    spec = importlib.util.spec_from_file_location("induction", ROOT / "scripts" / "induction.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _logged(run_dir, best, losses, icl, context=64):
    """A run folder whose evaluations (every 25 steps) logged these best induction scores,
    validation losses and in-context learning scores, one head of the two at ``best``."""
    run_dir.mkdir(parents=True)
    (run_dir / "config.yaml").write_text(yaml.safe_dump({"model": {"context_length": context}}))
    rows = [{"step": 10, "train_loss": 4.0}]
    for i, (b, v, c) in enumerate(zip(best, losses, icl, strict=True)):
        heads = {"induction": [[0.02, b]], "previous_token": [[0.1, 0.1]]}
        rows.append({"step": 25 * (i + 1), "val_loss": v, "icl_score": c, "heads": heads})
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return run_dir


def test_the_formation_step_is_the_first_evaluation_whose_best_head_reaches_the_threshold(
    tmp_path,
):
    induction = _script()
    run = _logged(
        tmp_path / "run",
        best=[0.03, 0.05, 0.25, 0.6, 0.9, 0.95],
        losses=[3.9, 3.9, 3.6, 2.6, 2.1, 2.0],
        icl=[0.0, 0.0, -0.3, -1.2, -1.7, -1.8],
    )
    found = induction.measure(run, 0.5)
    assert found["formed"] == 100 and found["rise"] == 25  # 0.2 first reached at step 75
    assert found["loss_half"] == 100  # 2.6 is the first loss at or below (3.9 + 2.0) / 2
    assert found["icl_half"] == 100 and found["best_half"] == 100
    assert found["loss_lag"] == found["icl_lag"] == 0
    assert found["peak"] == 0.95 and found["loss"] == (3.9, 2.0)
    never = _logged(tmp_path / "never", [0.03, 0.04], [3.9, 3.9], [None, None])
    assert induction.measure(never, 0.5)["formed"] is None
    assert induction.measure(never, 0.5)["icl_half"] is None  # no score to read


def test_the_fit_finds_the_exponent_of_formation_against_context(tmp_path, capsys, monkeypatch):
    induction = _script()
    for context in (16, 32, 64):
        for seed in (1, 2):
            formed = (context // 16) ** 2 * 4  # the evaluation index: step 100 * (T / 16)^2
            best = [0.0] * (formed - 1) + [0.9]
            _logged(
                tmp_path / f"model.context_length={context}" / f"seed{seed}",
                best, [3.0] * formed, [0.0] * formed, context,
            )  # fmt: skip
    monkeypatch.setattr(
        sys, "argv", ["induction.py", str(tmp_path), "--fit", "model.context_length"]
    )
    induction.main()
    out = capsys.readouterr().out
    assert "| model.context_length=64 | 2 | 2 of 2 | 1600 ± 0 |" in out
    assert "exponent, each seed's own fit: 2.00 ± 0.00" in out
    assert "exponent of the means' fit: 2.00" in out


def test_the_picture_draws_a_panel_per_family_and_refuses_to_leave_a_run_out(
    tmp_path, capsys, monkeypatch
):
    induction = _script()
    for scheme, best in (("rope", 0.9), ("t5", 0.6), ("none", 0.03)):
        for seed in (1, 2):
            _logged(tmp_path / f"position={scheme}" / f"seed{seed}", [0.0, best], [3, 2], [0, -1])
    drawn = {}
    monkeypatch.setattr(
        induction.plots, "induction_vs_step", lambda c, t, p, grid: drawn.update(grid=grid)
    )
    argv = ["induction.py", str(tmp_path), "--picture", str(tmp_path / "p.png")]
    biases = "biases=position=rope,position=t5"
    monkeypatch.setattr(sys, "argv", [*argv, "--panel", biases, "--panel", "none=position=none"])
    induction.main()
    assert drawn["grid"] == {
        "biases": ["position=rope", "position=t5"],
        "none": ["position=none"],
    }
    monkeypatch.setattr(sys, "argv", [*argv, "--panel", biases])  # position=none in no panel
    with pytest.raises(SystemExit) as e:
        induction.main()
    assert str(e.value) == "induction.py: --panel: position=none in no panel"
    monkeypatch.setattr(sys, "argv", [*argv, "--panel", "biases=position=alibi"])
    with pytest.raises(SystemExit) as e:
        induction.main()
    assert "'biases=position=alibi'" in str(e.value) and "\n" not in str(e.value)
