"""Pictures and reports read well for any sweep (issue 12): legends name what differs and stay
clear of the panels, one point shows, byte tokens are readable, wording fits the counts."""

from __future__ import annotations

import dataclasses
import subprocess
import sys

import numpy as np
import pytest
from _support import tiny_config
from test_report import result

from lm.compare import plots
from lm.compare.report import labels, render
from lm.data.tokenizer import train_tokenizer

MEASURED = {"final_val_loss": 3.0, "best_val_loss": 2.9, "tokens_per_s": 100.0, "wall_s": 5.0}


def _result(**more):
    return result("rope", 1, extrapolation=[3.0, 3.1, 3.2], **{**MEASURED, **more})


def _legend_clear(fig) -> None:
    """Every legend lies inside the figure and covers no panel (with its labels and title)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    canvas = FigureCanvasAgg(fig)
    canvas.draw()
    renderer = canvas.get_renderer()
    whole = fig.bbox
    legends = [*fig.legends, *(ax.get_legend() for ax in fig.axes if ax.get_legend())]
    assert legends
    for legend in legends:
        box = legend.get_window_extent(renderer)
        assert whole.x0 <= box.x0 and box.x1 <= whole.x1, (box, whole)
        assert whole.y0 <= box.y0 and box.y1 <= whole.y1, (box, whole)
        for ax in fig.axes:
            assert not box.overlaps(ax.get_tightbbox(renderer)), (box, ax.get_title())


def _curves(labels_: list[str], points: int = 6) -> plots.Curves:
    return {
        label: [(list(range(points)), [4.0 - i / 10 - k for i in range(points)])]
        for k, label in enumerate(labels_)
    }


LONG = [f"position=rope, n_layer={n}, lr=0.00{n}, batch_size=64, dropout=0.1" for n in range(5)]


def test_loss_curve_legends_stay_clear_of_the_panels():
    fig = plots.loss_curves_figure(
        {"training loss": _curves(LONG), "validation loss": _curves(LONG)}, "step"
    )
    _legend_clear(fig)
    assert len(fig.legends) == 1  # one legend for both panels, not one over each


def test_loss_vs_context_legend_stays_clear():
    curves = {k: [([32, 64, 128], [3.0, 3.1, 3.2])] for k in LONG}
    _legend_clear(plots.loss_vs_context_figure(curves, dict.fromkeys(LONG, 32)))


def test_induction_against_step_tells_seventeen_schemes_apart_and_marks_the_threshold():
    names = [f"position={n}" for n in "abcdefghijklmnopq"]
    fig = plots.induction_vs_step_figure(
        {k: [([25, 50, 75], [0.0, 0.5, 1.0]), ([25, 50, 75], [0.0, 0.3, 0.9])] for k in names}, 0.5
    )
    _legend_clear(fig)
    (ax,) = fig.axes
    styles = [line.get_linestyle() for line in ax.lines if line.get_label().startswith("pos")]
    assert styles == ["-"] * 10 + ["--"] * 7  # past tab10's colours, dashed
    assert ax.lines[0].get_ydata().tolist() == pytest.approx([0.0, 0.4, 0.95])  # seeds' mean
    assert any(list(line.get_ydata()) == [0.5, 0.5] for line in ax.lines)  # the threshold


def test_induction_against_step_in_panels_gives_each_its_colours_and_legend_and_rope_one_colour():
    curves = {f"position={n}": [([25, 50], [0.1, 0.9])] for n in ("rope", "t5", "fox", "none")}
    panels = {
        "biases": ["position=rope", "position=t5"],
        "content": ["position=rope", "position=fox"],
        "nothing": ["position=none"],
    }
    fig = plots.induction_vs_step_figure(curves, 0.5, panels)
    assert [ax.get_title() for ax in fig.axes] == list(panels)  # the fourth cell left empty
    legends = [[t.get_text() for t in ax.get_legend().get_texts()] for ax in fig.axes]
    assert legends == list(panels.values())  # one seed: the group's name alone
    first = [[ln.get_color() for ln in ax.lines][:2] for ax in fig.axes]
    assert first[0][0] == first[1][0] == first[2][0]  # the first of each panel: one colour
    assert first[0][1] == first[1][1] != first[0][0]  # t5 and fox: each panel's second colour
    assert [len(ax.get_xlabel()) > 0 for ax in fig.axes] == [False, True, True]  # column bottoms
    assert not fig.legends


def test_a_single_logged_point_is_drawn_as_a_marker():
    fig = plots.loss_curves_figure({"validation loss": _curves(["a"], points=1)}, "step")
    (line,) = fig.axes[0].lines
    assert line.get_marker() == "o" and len(line.get_xdata()) == 1


def test_legends_and_labels_leave_out_housekeeping_keys():
    a = tiny_config(model={"n_layer": 1}, train={"log_every": 1, "eval_every": 3})
    b = tiny_config(model={"n_layer": 2}, train={"log_every": 2, "checkpoint_every": 4})
    assert labels([a, b]) == ("n_layer", ["1", "2"])
    c = tiny_config(model={"n_layer": 1}, train={"log_every": 2})
    assert labels([a, c]) == (
        "runs",
        ["eval_every=3, log_every=1", "eval_every=15, log_every=2"],
    )  # nothing else differs: housekeeping is all there is


def test_report_wording_fits_any_sweep():
    one = [_result()]
    markdown, _ = render(one, "def", 5)
    assert "# Runs of one config" in markdown and "1 run of one config: 1 seed." in markdown
    assert "values" not in markdown.split("\n")[2] and "seed(s)" not in markdown
    a = _result()
    b = dataclasses.replace(a, config=tiny_config(model={"n_layer": 1}, train={"lr": 1e-2}))
    c = dataclasses.replace(a, config=tiny_config(train={"seed": 2}))
    markdown, _ = render([a, c, b], "def", 5)
    assert "Runs compared by runs" not in markdown
    assert "# Runs compared by n_layer, lr" in markdown, markdown
    assert "3 runs: 2 combinations of the keys, 1 to 2 seeds per combination." in markdown
    assert "1-2" not in markdown


def test_a_numeric_sweep_names_its_key_in_the_legend(tmp_path):
    from lm.compare.report import _draw, _Grouping

    a = _result()
    drawn = {}

    def catch(panels, xlabel, path):
        drawn.update(panels["training loss"])
        return path

    original = plots.loss_curves
    plots.loss_curves = catch
    try:
        groups = {"2": [a], "4": [a]}
        _draw(_Grouping("n_layer", ["2", "4"], groups, groups), tmp_path)
    finally:
        plots.loss_curves = original
    assert list(drawn) == ["n_layer=2", "n_layer=4"]


def test_the_report_says_when_the_prompt_became_unk():
    a = _result(prompt_unknown=2)
    markdown, _ = render([a], "Zébra", 5)
    assert "2 characters of the prompt are not in the runs' vocabulary" in markdown


def test_byte_tokens_show_their_bytes():
    from lm.compare.diagnostics import token_text

    tok = train_tokenizer("byte", [])
    assert [token_text(tok, i) for i in tok.encode("aé")] == ["a", "\\xc3", "\\xa9"]
    char = train_tokenizer("char", ["ab\ufffd"])
    assert token_text(char, char.encode("\ufffd")[0]) == "\ufffd"


@pytest.mark.parametrize("position", ["alibi", "rope"])
def test_positions_names_what_it_plots(tmp_path, position):
    from unittest import mock

    from _support import train_via_cli

    from lm.compare.diagnostics import draw_score_by_offset

    run = train_via_cli(tmp_path, max_steps=2) if position == "rope" else None
    if run is None:
        from _support import write_config

        from lm.cli import main

        cfg = write_config(tmp_path / "c.yaml", model={"position": "alibi"}, train={"max_steps": 2})
        assert main(["train", str(cfg), "--out", str(tmp_path / "run"), "--quiet"]) == 0
        run = tmp_path / "run"
    with mock.patch.object(plots, "score_by_offset") as draw:
        draw_score_by_offset(run, tmp_path / "s.png", windows=1)
    ylabel = draw.call_args.kwargs["ylabel"]
    assert ("alibi bias" in ylabel) == (position == "alibi"), ylabel
    # lm positions RUN: the score by offset, and the bias alone for a scheme that adds one.
    from lm.cli import main

    assert main(["positions", str(run), "--out", str(tmp_path / "p.png"), "--windows", "1"]) == 0
    assert (tmp_path / "p.png").is_file()
    assert (tmp_path / "p_bias.png").is_file() == (position == "alibi")


def test_the_bias_drawn_against_distance_is_what_each_layer_adds():
    import numpy as np
    import torch

    from lm.compare.diagnostics import bias_by_distance
    from lm.config.sections import ModelConfig
    from lm.model.transformer import TransformerLM

    def model(position: str) -> TransformerLM:
        config = dict(vocab_size=10, context_length=8, n_layer=2, n_head=2, d_model=8)
        return TransformerLM(ModelConfig(**config, position=position))

    drawn = bias_by_distance(model("alibi"), torch.zeros(1, 6, dtype=torch.long))
    assert list(drawn) == [0, 1]
    d = np.arange(6)
    for layer in drawn.values():  # -m_h d with m = 2^-4, 2^-8 for two heads
        np.testing.assert_allclose(layer, np.stack([-(2.0**-4) * d, -(2.0**-8) * d]), rtol=1e-6)
    assert bias_by_distance(model("rope"), torch.zeros(1, 6, dtype=torch.long)) == {}
    assert torch.is_grad_enabled()
    t5 = model("t5")  # T5: each head's learned scalar of the distance's bucket, in every layer
    drawn = bias_by_distance(t5, torch.zeros(1, 20, dtype=torch.long))
    table = t5.blocks[0].attn.position.table.detach().numpy()
    buckets = [*range(16), 16, 16, 16, 17]  # distances 16..19: 16 + floor(log(d/16)/log 8 * 16)
    for layer in (0, 1):
        np.testing.assert_allclose(drawn[layer], table[:, buckets], rtol=1e-6)
    kerple = model("kerple")  # each layer its own -r1 log(1 + r2 d)
    drawn = bias_by_distance(kerple, torch.zeros(1, 6, dtype=torch.long))
    for i, layer in drawn.items():
        part = kerple.blocks[i].attn.position
        r1, r2 = (r.detach().clamp(min=0.01).numpy()[:, None] for r in (part.r1, part.r2))
        np.testing.assert_allclose(layer, -r1 * np.log1p(r2 * d), rtol=1e-5)
    fire = model("fire")  # its own function of the distance, for a query at position 5
    for i, layer in bias_by_distance(fire, torch.zeros(1, 6, dtype=torch.long)).items():
        part = fire.blocks[i].attn.position
        head, query, key = torch.arange(2)[:, None], torch.tensor(5), 5 - torch.arange(6)
        expected = part.formula(*part.arguments(None), head, query, key)
        np.testing.assert_allclose(layer, expected.detach().numpy(), rtol=1e-5)


def test_drawing_prints_no_warning(tmp_path):
    a, b = tmp_path / "a.png", tmp_path / "b.png"
    code = (
        "from lm.compare import plots; import numpy as np;"
        f"plots.loss_curves({{'t': {{}}, 'v': {{'a': [([1], [2.0])]}}}}, 'step', r'{a}');"
        f"plots.attention_maps(np.ones((1, 3, 3)), ['\\xc3', ' ', '\\n'], ['h'], r'{b}')"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0 and out.stderr == "", out.stderr


def test_up_to_twenty_groups_get_twenty_colours():
    from lm.compare.plots import _colours

    assert len(set(_colours(20))) == 20


def test_scores_by_offset_count_only_pairs_training_could_see(tmp_path):
    from unittest import mock

    from _support import write_config

    from lm.cli import main
    from lm.compare.diagnostics import draw_score_by_offset
    from lm.model.transformer import TransformerLM

    # A padded task run: examples of at most 2 * 4 + 2 = 10 tokens in a context of 32.
    task = {"source": "builtin:copy", "mode": "padded", "task_lengths": "1-4",
            "task_eval_lengths": "1-4", "task_examples": 400}  # fmt: skip
    cfg = write_config(tmp_path / "c.yaml", data=task, train={"max_steps": 2, "eval_every": 2})
    assert main(["train", str(cfg), "--out", str(tmp_path / "run"), "--quiet"]) == 0
    seen = {}
    real_weights = TransformerLM.attention_weights

    def spied(model, ids, key_mask=None, segment_ids=None):
        seen.update(ids=ids, key_mask=key_mask)
        return real_weights(model, ids, key_mask, segment_ids)

    with (
        mock.patch.object(TransformerLM, "attention_weights", spied),
        mock.patch.object(plots, "score_by_offset") as draw,
    ):
        profile, _ = draw_score_by_offset(tmp_path / "run", tmp_path / "s.png", windows=8)
    lengths = seen["key_mask"].sum(dim=1)  # each example's real tokens
    assert profile.shape[-1] == int(lengths.max()) <= 10  # no offset reaches past an example
    # Offset d averages the pairs (l, l - d) inside one example: sum over examples of n - d.
    pairs = [int((lengths - d).clamp(min=0).sum()) for d in range(profile.shape[-1])]
    title = draw.call_args.kwargs["title"]
    assert f"{pairs[0]:,} query-key pairs at offset 0" in title, title
    assert f"{pairs[-1]:,} at {len(pairs) - 1}" in title, title
    assert np.isfinite(profile).all()
