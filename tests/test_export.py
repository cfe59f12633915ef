"""``lm export`` / ``lm import``: every position scheme to Hugging Face transformers and back.

Each scheme trains a tiny run once (module fixture); transformers must then compute lm's logits
on a left-padded batch, decode the same greedy tokens, and an import must return the very bits.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import fields
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from _export_support import TEXT, untrained_run
from _support import write_config
from safetensors import safe_open
from safetensors.torch import save_file
from transformers import AutoModelForCausalLM, AutoTokenizer

from lm.cli import main
from lm.config.names import POSITIONS
from lm.config.sections import ModelConfig
from lm.data.tokenizer import train_tokenizer
from lm.hf.shapes import TARGETS, mpt_slopes
from lm.model.masks import positions_from_mask
from lm.model.schemes.biases import alibi_slopes
from lm.runs.load import load_run
from lm.sample import generate

ARCHITECTURES = {
    "gpt_neox": "GPTNeoXForCausalLM",
    "gpt2": "GPT2LMHeadModel",
    "mpt": "MptForCausalLM",
    "llama": "LlamaForCausalLM",
    "qwen3": "Qwen3ForCausalLM",
}
LLAMA_BLOCK = {"norm": "rmsnorm", "mlp": "swiglu", "tie_embeddings": False}
# Each target, from a model that trained a few steps: the GPT-2 block with each scheme it
# exports, and the Llama-style block as Llama (grouped-query heads) and as Qwen3 (multi-query
# heads with QK-norm).
TRAINED = {
    **{position: ({"position": position}, model_type) for position, model_type in TARGETS.items()},
    "llama": ({**LLAMA_BLOCK, "n_head": 4, "n_kv_head": 2}, "llama"),
    "qwen3": ({**LLAMA_BLOCK, "n_kv_head": 1, "qk_norm": True}, "qwen3"),
}
TEXTS = ["def f(x):\n    return x", "The for", "import os\nimport sys\n"]


@pytest.fixture(scope="module")
def data_cache(tmp_path_factory):
    return tmp_path_factory.mktemp("export-data")


def hf_forward(model, batch) -> torch.Tensor:
    """transformers' logits with lm's positions: real tokens counted from 0 in every row (what
    generate() derives from the mask; a plain forward call needs them given)."""
    mask = batch["attention_mask"]
    kwargs = {"input_ids": batch["input_ids"], "attention_mask": mask}
    if model.config.model_type != "mpt":  # ALiBi reads only distances
        kwargs["position_ids"] = positions_from_mask(mask.bool())
    with torch.no_grad():
        return model(**kwargs).logits


def lm_forward(run, batch) -> torch.Tensor:
    with torch.no_grad():
        return run.model(batch["input_ids"], key_mask=batch["attention_mask"].bool())


def largest_difference(run, hf, tok, texts=TEXTS) -> float:
    batch = tok(texts, return_tensors="pt", padding=True)
    real = batch["attention_mask"].bool()
    assert not bool(real.all()), "the batch must hold left padding"
    return (lm_forward(run, batch) - hf_forward(hf, batch))[real].abs().max().item()


def load_export(out: Path):
    hf, info = AutoModelForCausalLM.from_pretrained(
        out, dtype=torch.float32, output_loading_info=True
    )
    return hf.eval(), info, AutoTokenizer.from_pretrained(out)


@pytest.fixture(scope="module", params=tuple(TRAINED))
def exported(request, tmp_path_factory, data_cache):
    model, model_type = TRAINED[request.param]
    root = tmp_path_factory.mktemp(f"export-{request.param}")
    cfg = write_config(
        root / "tiny.yaml",
        model={**model, "context_length": 64},
        data={"cache_dir": str(data_cache)},
        train={"max_steps": 20, "eval_every": 20, "checkpoint_every": 20, "tensorboard": False},
    )
    run_dir, out = root / "run", root / "hf"
    assert main(["train", str(cfg), "--out", str(run_dir), "--quiet"]) == 0
    assert main(["export", str(run_dir), "--out", str(out)]) == 0
    hf, info, tok = load_export(out)
    return SimpleNamespace(
        position=model.get("position", "rope"),
        model_type=model_type,
        run_dir=run_dir,
        out=out,
        run=load_run(run_dir),
        hf=hf,
        info=info,
        tok=tok,
    )


def test_export_is_the_target_architecture_with_every_weight_used(exported):
    config = json.loads((exported.out / "config.json").read_text())
    model_type = exported.model_type
    assert config["model_type"] == model_type
    assert config["architectures"] == [ARCHITECTURES[model_type]]
    assert not exported.info["missing_keys"] and not exported.info["unexpected_keys"]
    assert not exported.info["mismatched_keys"]
    if model_type == "gpt_neox":  # full rotary, also for transformers 4 (its default is 0.25)
        assert config["rope_parameters"]["partial_rotary_factor"] == 1.0
        assert config["rotary_pct"] == 1.0 and config["rotary_emb_base"] == 10000.0
        assert config["use_parallel_residual"] is False
    names = sorted(p.name for p in exported.out.iterdir())
    assert names == [
        "README.md",
        "config.json",
        "generation_config.json",
        "lm_config.yaml",
        "model.safetensors",
        "tokenizer.json",
        "tokenizer_config.json",
    ]
    card = (exported.out / "README.md").read_text()
    assert f"`{exported.position}`" in card and "validation loss" in card
    assert "AutoModelForCausalLM.from_pretrained" in card


def test_transformers_logits_equal_lm_on_a_left_padded_batch(exported):
    assert largest_difference(exported.run, exported.hf, exported.tok) < 1e-4


def test_greedy_generate_gives_the_tokens_of_lm_sample(exported, capsys):
    tok, lm_tok = exported.tok, exported.run.tokenizer
    prompts = ["def f", "The for statement"]
    batch = tok(prompts, return_tensors="pt", padding=True)
    with torch.no_grad():
        out = exported.hf.generate(**batch, max_new_tokens=40, do_sample=False)
    new = out[:, batch["input_ids"].shape[1] :].tolist()
    theirs = [row[: row.index(lm_tok.eod_id)] if lm_tok.eod_id in row else row for row in new]
    ours = generate(
        exported.run.model, [lm_tok.encode(p) for p in prompts], 40, lm_tok.pad_id, lm_tok.eod_id
    )
    assert theirs == ours
    assert any(len(row) == 40 for row in ours)  # some row really decoded 40 tokens

    capsys.readouterr()
    assert (
        main(["sample", str(exported.run_dir), "--prompt", prompts[0], "--max-new-tokens", "40"])
        == 0
    )
    assert capsys.readouterr().out == prompts[0] + tok.decode(theirs[0]) + "\n"


def test_import_of_the_export_gives_back_the_same_bits(exported, tmp_path, capsys):
    back_dir = tmp_path / "imported"
    capsys.readouterr()
    assert main(["import", str(exported.out), "--out", str(back_dir)]) == 0
    out, err = capsys.readouterr()
    back = load_run(back_dir)
    m = back.config.model
    assert out == f"{back_dir}\n"  # the run, alone on standard output; what it is, on stderr
    scheme = m.position + (" (rope_base 10000, rope_scaling none)" if m.position == "rope" else "")
    kv = f" ({m.kv_heads} key/value)" if m.kv_heads != m.n_head else ""
    assert err == (
        f"lm: imported {exported.model_type} as a run: "
        f"{back.model.num_parameters() / 1e6:.2f}M parameters, {m.n_layer} layers, {m.n_head} "
        f"heads{kv}, width {m.d_model}, context {m.context_length}, {scheme} positions\n"
    )
    ours, theirs = exported.run.model.state_dict(), back.model.state_dict()
    assert ours.keys() == theirs.keys()
    for name, tensor in ours.items():
        assert theirs[name].dtype == tensor.dtype and torch.equal(theirs[name], tensor), name
    assert back.config.model == exported.run.config.model
    assert back.config.data == exported.run.config.data
    tokenizer = (exported.run_dir / "tokenizer.json").read_bytes()
    assert (back_dir / "tokenizer.json").read_bytes() == tokenizer
    record = json.loads((back_dir / "run.json").read_text())
    assert record["imported_from"] == str(exported.out.resolve())
    assert record["model_type"] == exported.model_type

    # The imported run is a run: lm sample and lm eval accept it.
    capsys.readouterr()
    assert main(["sample", str(back_dir), "--prompt", "def", "--max-new-tokens", "5"]) == 0
    assert capsys.readouterr().out.startswith("def")
    assert main(["eval", str(back_dir), "--max-batches", "1"]) == 0
    assert "| 64 |" in capsys.readouterr().out


@pytest.mark.parametrize("kind", ["char", "byte", "bpe"])
def test_auto_tokenizer_encodes_and_decodes_as_lm(kind, tmp_path):
    tok = train_tokenizer(kind, [TEXT] * 3, vocab_size=300 if kind == "bpe" else None)
    run_dir = untrained_run(tmp_path, tokenizer=tok)
    assert main(["export", str(run_dir), "--out", str(tmp_path / "hf")]) == 0
    auto = AutoTokenizer.from_pretrained(tmp_path / "hf")
    assert (auto.pad_token_id, auto.eos_token_id) == (tok.pad_id, tok.eod_id)
    texts = [
        TEXT,
        " leading space",
        "a literal <eod> and <pad> stay text",
        "\n\n",
        "\u00e9t\u00e9 \U0001f600",
    ]
    for text in texts:
        ids = tok.encode(text)
        assert auto.encode(text) == ids, text
        assert auto(text)["input_ids"] == ids, text
        assert auto.decode(ids) == tok.decode(ids), text
    assert tok.eod_id not in auto.encode("<eod>")
    if kind != "char":  # every string round-trips exactly through byte-level tokenizers
        assert all(auto.decode(auto.encode(t)) == t for t in texts)
    else:
        assert auto.unk_token_id == tok.unk_id


# Every model key away from its default, for every scheme: each case is exported exactly
# (transformers' logits equal lm's, and an import gives back the same config and bits) or
# refused in one line naming why. ``None`` expects an exact export; a string, a refusal saying it.
SHAPE = {"bias": True, "tie_embeddings": False, "d_ff": 48, "norm_eps": 1e-6, "dropout": 0.1}


def case(refusal: str | None = None, **model: Any) -> tuple[dict[str, Any], str | None]:
    return model, refusal


EVERY_SETTING = {
    "rope-shape": case(position="rope", **SHAPE, n_head=4, rope_base=500.0),
    "rope-layers": case(position="rope", n_layer=1, kernel="math"),
    "rope-pi": case(position="rope", rope_scaling="pi:4"),
    "rope-pi-factor-1": case(position="rope", rope_scaling="pi:1"),
    "rope-ntk": case(position="rope", rope_scaling="ntk:2"),
    "rope-fraction": case(position="rope", rope_fraction=0.5),
    "rope-one-pair": case(position="rope", rope_fraction=0.125),
    "rope-fraction-pi": case(position="rope", rope_fraction=0.5, rope_scaling="pi:2.5"),
    "rope-fraction-ntk": case(
        position="rope", rope_fraction=0.25, rope_scaling="ntk:4", rope_base=1e3
    ),
    # A context of 64 or 32: pairs that turn 1 to 32 times over it, where the ramps differ.
    "rope-yarn": case("YaRN ramp is linear in the pair", position="rope", rope_scaling="yarn:2"),
    "rope-yarn-original": case(
        "pair 0 of 8",
        position="rope",
        rope_scaling="yarn:4",
        context_length=128,
        rope_original_context=32,
    ),
    # Two pairs per head, one turning 41 times over 256 tokens, one 0.4 times: the ramps agree.
    "rope-yarn-agrees": case(
        position="rope",
        rope_scaling="yarn:4",
        d_model=8,
        context_length=512,
        rope_original_context=256,
    ),
    "rope-yarn-fraction": case(
        "unrotated features",
        position="rope",
        rope_scaling="yarn:3",
        d_model=16,
        rope_fraction=0.5,
        context_length=256,
    ),
    "learned": case(position="learned", **SHAPE, n_head=4, context_length=32),
    "sinusoidal": case(position="sinusoidal", **SHAPE, n_head=4),
    "sinusoidal-unscaled": case(position="sinusoidal", scale_embeddings=False),
    "none": case(position="none", **SHAPE, kernel="math"),
    "alibi": case(
        position="alibi", tie_embeddings=False, n_head=4, dropout=0.1, norm_eps=1e-6, n_layer=1
    ),
    "alibi-bias": case("no biases", position="alibi", bias=True),
    "alibi-d-ff": case("4 x d_model", position="alibi", d_ff=64),
    # Trained on random positions, the model reads ordinary ones: the export is the same model.
    "rope-random-positions": case(position="rope", random_positions=256),
    "learned-random-positions": case(position="learned", context_length=32, random_positions=48),
    "random-positions-at-evaluation": case(
        "model.random_positions_eval: true cannot be exported",
        position="rope",
        random_positions=256,
        random_positions_eval=True,
    ),
    "t5": case(
        "model.position: t5 cannot be exported", position="t5", t5_buckets=8, t5_max_distance=16
    ),
    "kerple": case("model.position: kerple cannot be exported", position="kerple"),
    "fire": case(
        "model.position: fire cannot be exported",
        position="fire",
        fire_width=8,
        fire_threshold=64.0,
    ),
    "hybrid": case("[rope, none] sets a scheme per layer", position=["rope", "none"]),
    "sandwich": case("model.position: sandwich cannot be exported", position="sandwich"),
    "xpos": case("model.position: xpos cannot be exported", position="xpos", xpos_scale_base=64.0),
    "fox": case("model.position: fox cannot be exported", position="fox"),
    "cope": case("model.position: cope cannot be exported", position="cope", cope_max=8),
    "pope": case("model.position: pope cannot be exported", position="pope"),
    "fope": case("model.position: fope cannot be exported", position="fope"),
    "hope": case("model.position: hope cannot be exported", position="hope"),
    "dape": case("model.position: dape cannot be exported", position="dape", dape_bias="alibi"),
    "path": case("model.position: path cannot be exported", position="path"),
    "p-rope": case("model.rope_p: 0.5 cannot be exported", position="rope", rope_p=0.5),
    "ssmax": case("model.normalize: ssmax cannot be exported", position="rope", normalize="ssmax"),
    "stick-breaking": case(
        "model.normalize: stick_breaking cannot be exported",
        position="none",
        normalize="stick_breaking",
    ),
    "window": case("model.window: 8 cannot be exported", position="rope", window=8),
    # The Llama-style block: RoPE as Llama (grouped-query or multi-query heads, biases, any MLP
    # width, a RoPE extension), with QK-norm as Qwen3; every other block refused naming why.
    "llama": case(
        position="rope", **{**LLAMA_BLOCK, **SHAPE}, n_head=4, n_kv_head=2, rope_scaling="pi:2"
    ),
    "llama-mqa-tied": case(position="rope", norm="rmsnorm", mlp="swiglu", n_kv_head=1),
    "qwen3": case(position="rope", **LLAMA_BLOCK, n_head=4, n_kv_head=2, qk_norm=True, d_ff=40),
    "qwen3-ntk": case(
        position="rope", **LLAMA_BLOCK, qk_norm=True, rope_scaling="ntk:2", norm_eps=1e-6
    ),
    "qwen3-bias": case("Qwen3", position="rope", **LLAMA_BLOCK, qk_norm=True, bias=True),
    "llama-rope-fraction": case(
        "model.rope_fraction: 0.5 cannot be exported: Llama and Qwen3 rotate every feature",
        position="rope",
        **LLAMA_BLOCK,
        rope_fraction=0.5,
    ),
    "llama-alibi": case(
        "model.position: alibi with model.norm: rmsnorm cannot be exported",
        position="alibi",
        **LLAMA_BLOCK,
    ),
    "llama-learned": case("and no position table", position="learned", **LLAMA_BLOCK),
    "swiglu-layernorm": case(
        "model.norm: layernorm with model.mlp: swiglu cannot be exported: Llama and Qwen3, the "
        "targets of grouped-query heads, QK-norm and SwiGLU, have RMSNorm norms",
        position="rope",
        mlp="swiglu",
    ),
    "gqa-layernorm": case(
        "model.norm: layernorm with model.n_kv_head: 1", position="rope", n_kv_head=1
    ),
    "qk-norm-layernorm": case(
        "model.norm: layernorm with model.qk_norm", position="rope", qk_norm=True
    ),
    "rmsnorm-gelu": case(
        "model.mlp: gelu with model.norm: rmsnorm", position="rope", norm="rmsnorm"
    ),
    "relu2": case("model.mlp: relu2 cannot be exported", position="rope", mlp="relu2"),
    "attention-only": case("model.mlp: none cannot be exported", position="rope", mlp="none"),
    "attention-only-llama": case(
        "model.mlp: none cannot be exported", position="rope", **{**LLAMA_BLOCK, "mlp": "none"}
    ),
    "smeared-keys": case(
        "model.smear_keys: true cannot be exported", position="rope", smear_keys=True
    ),
}


def test_every_model_key_is_set_away_from_its_default_by_some_case():
    varied = {key for model, _ in EVERY_SETTING.values() for key in model}
    assert {f.name for f in fields(ModelConfig)} - varied == {"vocab_size"}
    positions = {m["position"] for m, _ in EVERY_SETTING.values() if isinstance(m["position"], str)}
    assert positions == set(POSITIONS)


@pytest.mark.parametrize(("model", "refusal"), EVERY_SETTING.values(), ids=EVERY_SETTING.keys())
def test_every_setting_of_every_scheme_exports_exactly_or_is_refused(
    model, refusal, tmp_path, capsys
):
    run_dir = untrained_run(tmp_path, **model)
    out, back_dir = tmp_path / "hf", tmp_path / "back"
    if refusal is not None:
        refused(capsys, ["export", str(run_dir), "--out", str(out)], refusal)
        nothing_written(tmp_path, "hf")
        return
    assert main(["export", str(run_dir), "--out", str(out)]) == 0
    hf, info, tok = load_export(out)
    assert not info["missing_keys"] and not info["unexpected_keys"]
    run = load_run(run_dir)
    # Left padding, and a text past the trained context (where the RoPE extensions matter most).
    texts = [*TEXTS, "x = 1\n" * (run.config.model.context_length // 4)]
    if model["position"] == "learned":
        texts = TEXTS
    assert largest_difference(run, hf, tok, texts) < 1e-4
    assert main(["import", str(out), "--out", str(back_dir)]) == 0
    back = load_run(back_dir)
    # The run comes back as it trained: random positions and a learned table's own context too.
    assert back.config.model == run.config.model
    ours, theirs = run.model.state_dict(), back.model.state_dict()
    if model["position"] == "sinusoidal":
        # Untied, E is used only as E * sqrt(d), which is what the export holds: that product
        # comes back bit for bit (E itself may differ in its last bit: the product is not
        # one-to-one in floats).
        scale = run.model.pos_embed.scale
        assert torch.equal(theirs.pop("embed.weight") * scale, ours.pop("embed.weight") * scale)
    for name, tensor in ours.items():
        assert torch.equal(theirs[name], tensor), name


def test_rope_settings_are_written_where_transformers_reads_them(tmp_path):
    """The rope_parameters of each setting, and the keys transformers 4 reads instead."""
    from lm.model.schemes.rope import ntk_base

    cases = {
        "pi:4": {"rope_type": "linear", "factor": 4.0, "rope_theta": 1e4},
        "ntk:2": {"rope_type": "default", "rope_theta": ntk_base(1e4, 2.0, 8)},
    }
    for i, (scaling, wanted) in enumerate(cases.items()):
        run_dir = untrained_run(
            tmp_path / str(i), position="rope", rope_scaling=scaling, rope_fraction=0.5
        )
        out = tmp_path / str(i) / "hf"
        assert main(["export", str(run_dir), "--out", str(out)]) == 0
        config = json.loads((out / "config.json").read_text())
        assert config["rope_parameters"] == {**wanted, "partial_rotary_factor": 0.5}
        assert config["rotary_pct"] == 0.5
        assert config["rotary_emb_base"] == config["rope_theta"] == wanted["rope_theta"]
        assert config.get("rope_scaling") == (
            config["rope_parameters"] if wanted["rope_type"] != "default" else None
        )


def test_bias_free_layers_export_zero_biases(tmp_path):
    run_dir = untrained_run(tmp_path, position="rope")
    assert main(["export", str(run_dir), "--out", str(tmp_path / "hf")]) == 0
    with safe_open(str(tmp_path / "hf" / "model.safetensors"), "pt") as f:
        biases = [f.get_tensor(k) for k in f.keys() if k.endswith(".bias")]  # noqa: SIM118
    assert biases and all(not bool(b.any()) for b in biases)


@pytest.mark.parametrize("dtype", ["bf16", "fp16"])
def test_half_precision_exports(dtype, tmp_path):
    run_dir = untrained_run(tmp_path, position="rope")
    out = tmp_path / "hf"
    assert main(["export", str(run_dir), "--out", str(out), "--dtype", dtype]) == 0
    wanted = {"bf16": torch.bfloat16, "fp16": torch.float16}[dtype]
    with safe_open(str(out / "model.safetensors"), "pt") as f:
        assert all(f.get_tensor(k).dtype == wanted for k in f.keys())  # noqa: SIM118
    hf = AutoModelForCausalLM.from_pretrained(out, dtype="auto")
    assert hf.dtype == wanted
    # Back in lm the weights are exactly the rounded ones.
    assert main(["import", str(out), "--out", str(tmp_path / "back")]) == 0
    back = load_run(tmp_path / "back").model.state_dict()
    for name, tensor in load_run(run_dir).model.state_dict().items():
        assert torch.equal(back[name], tensor.to(wanted).float()), name


@pytest.mark.parametrize(
    ("position", "positions", "needle"),
    [
        ("sinusoidal", "100000000", "1 GiB"),
        ("none", "100000000", "1 GiB"),
        ("rope", str(2**24 + 1), "2^24"),
        ("alibi", "100000000000000000000", "2^24"),
    ],
)
def test_max_positions_is_bounded_in_one_line(position, positions, needle, tmp_path, capsys):
    run_dir = untrained_run(tmp_path, position=position)
    argv = ["export", str(run_dir), "--out", str(tmp_path / "hf"), "--max-positions", positions]
    refused(capsys, argv, f"--max-positions {positions}", needle)
    nothing_written(tmp_path, "hf")


@pytest.mark.parametrize("n_head", [1, 2, 3, 4, 6, 8, 12, 16])
def test_mpt_alibi_slopes_are_lms(n_head):
    assert torch.allclose(mpt_slopes(n_head), alibi_slopes(n_head), rtol=1e-6, atol=0.0)


def test_long_export_range_for_schemes_without_a_table(tmp_path):
    run_dir = untrained_run(tmp_path, position="sinusoidal")
    out = tmp_path / "hf"
    assert main(["export", str(run_dir), "--out", str(out), "--max-positions", "300"]) == 0
    config = json.loads((out / "config.json").read_text())
    assert config["n_positions"] == 300 and config["tie_word_embeddings"] is False
    hf, _, tok = load_export(out)
    long = ["x = 1\n" * 40, "y"]  # 240 tokens: past the trained context of 64
    assert largest_difference(load_run(run_dir), hf, tok, long) < 1e-4


# ---------------------------------------------------------------------------------------------
# Bad input: one line, exit status 2, nothing written


def refused(capsys, argv: list[str], *needles: str) -> str:
    capsys.readouterr()
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("lm: error: ") and err.count("\n") == 1, err
    for needle in needles:
        assert needle in err, err
    return err


def nothing_written(parent: Path, name: str) -> None:
    assert not (parent / name).exists()
    assert not [p for p in parent.iterdir() if p.name.startswith(f".{name}.")]


def test_export_refuses_bad_input(tmp_path, capsys):
    not_a_run = tmp_path / "notes"
    not_a_run.mkdir()
    refused(capsys, ["export", str(not_a_run), "--out", str(tmp_path / "a")], "not a run")
    nothing_written(tmp_path, "a")

    run_dir = untrained_run(tmp_path / "r", position="learned")
    for ckpt in (run_dir / "checkpoints").iterdir():
        for f in ckpt.iterdir():
            f.unlink()
        ckpt.rmdir()
    refused(capsys, ["export", str(run_dir), "--out", str(tmp_path / "b")], "no checkpoint")
    nothing_written(tmp_path, "b")

    good = untrained_run(tmp_path / "g", position="learned")
    taken = tmp_path / "taken"
    taken.mkdir()
    (taken / "keep.txt").write_text("mine")
    refused(capsys, ["export", str(good), "--out", str(taken)], "already exists", "--overwrite")
    refused(capsys, ["export", str(good), "--out", str(taken), "--overwrite"], "not an lm export")
    assert [p.name for p in taken.iterdir()] == ["keep.txt"]
    refused(
        capsys,
        ["export", str(good), "--out", str(tmp_path / "c"), "--max-positions", "128"],
        "learned position table",
    )
    nothing_written(tmp_path, "c")

    # An earlier export is replaced on request.
    out = tmp_path / "hf"
    assert main(["export", str(good), "--out", str(out)]) == 0
    refused(capsys, ["export", str(good), "--out", str(out)], "already exists")
    assert main(["export", str(good), "--out", str(out), "--overwrite", "--dtype", "bf16"]) == 0
    assert json.loads((out / "config.json").read_text())["dtype"] == "bfloat16"


def test_a_scheme_no_architecture_computes_is_refused_naming_it(tmp_path, capsys, monkeypatch):
    import lm.hf.shapes

    run_dir = untrained_run(tmp_path, position="alibi")
    targets = {k: v for k, v in TARGETS.items() if k != "alibi"}
    monkeypatch.setattr(lm.hf.shapes, "TARGETS", targets)
    refused(capsys, ["export", str(run_dir), "--out", str(tmp_path / "hf")], "alibi", "exports")
    nothing_written(tmp_path, "hf")


MISTRAL = {
    "architectures": ["MistralForCausalLM"],
    "model_type": "mistral",
    "hidden_size": 32,
    "intermediate_size": 86,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "num_hidden_layers": 2,
    "hidden_act": "silu",
    "rms_norm_eps": 1e-6,
    "vocab_size": 100,
}


def test_import_refuses_what_lm_cannot_compute(tmp_path, capsys):
    mistral = tmp_path / "mistral"
    mistral.mkdir()
    (mistral / "config.json").write_text(json.dumps(MISTRAL))
    needles = "'mistral'", "the Llama and Qwen3 shape"
    refused(capsys, ["import", str(mistral), "--out", str(tmp_path / "r1")], *needles)
    nothing_written(tmp_path, "r1")

    refused(capsys, ["import", str(tmp_path), "--out", str(tmp_path / "r2")], "no config.json")
    nothing_written(tmp_path, "r2")

    # Exports edited into shapes lm does not have: the first mismatch is named.
    rope = untrained_run(tmp_path / "rope", position="rope")
    learned = untrained_run(tmp_path / "learned", position="learned")
    llama = untrained_run(tmp_path / "llama", position="rope", **LLAMA_BLOCK)
    qwen3 = untrained_run(tmp_path / "qwen3", position="rope", **LLAMA_BLOCK, qk_norm=True)
    lm_can = "lm computes rope_type default (any rope_theta; NTK-aware scaling exports as one)"
    cases = [
        (rope, {"use_parallel_residual": True}, "use_parallel_residual"),
        (rope, {"rope_parameters": {"rope_theta": 1e4, "partial_rotary_factor": 0.1875}}, "3 of"),
        (rope, {"hidden_act": "gelu_new"}, "hidden_act"),
        (learned, {"activation_function": "gelu_new"}, "activation_function"),
        (rope, {"rope_parameters": {"rope_type": "dynamic", "factor": 2.0}}, "grows the base"),
        (rope, {"rope_parameters": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                     "high_freq_factor": 4.0}}, lm_can),
        (
            rope,
            {"rope_parameters": {"rope_type": "yarn", "factor": 2.0,
                                 "original_max_position_embeddings": 64}},
            "YaRN ramp is linear in the pair index",
        ),
        (llama, {"hidden_act": "gelu"}, "hidden_act='gelu': lm's SwiGLU gates with SiLU"),
        (llama, {"head_dim": 8}, "head_dim=8: lm's heads are d_model / n_head = 16 wide"),
        (llama, {"pretraining_tp": 2}, "pretraining_tp"),
        (qwen3, {"use_sliding_window": True}, "use_sliding_window"),
        (qwen3, {"layer_types": ["sliding_attention", "full_attention"]}, "layer_types"),
    ]  # fmt: skip
    for i, (run_dir, change, needle) in enumerate(cases):
        out = tmp_path / f"hf{i}"
        assert main(["export", str(run_dir), "--out", str(out)]) == 0
        config = json.loads((out / "config.json").read_text())
        (out / "config.json").write_text(json.dumps({**config, **change}))
        refused(capsys, ["import", str(out), "--out", str(tmp_path / f"run{i}")], needle)
        nothing_written(tmp_path, f"run{i}")

    # An existing run is never replaced without --overwrite.
    refused(capsys, ["import", str(tmp_path / "hf3"), "--out", str(rope)], "already exists")
    assert (rope / "config.yaml").is_file()


@pytest.mark.parametrize(
    ("position", "missing"),
    [("learned", "transformer.wpe.weight"), ("rope", "gpt_neox.layers.0.attention.dense.weight")],
)
def test_an_import_without_a_tensor_names_it(position, missing, tmp_path, capsys):
    # GPT-2 reads its positions from wpe: a file without it is refused like any missing weight.
    out = tmp_path / "hf"
    assert main(["export", str(untrained_run(tmp_path, position=position)), "--out", str(out)]) == 0
    with safe_open(str(out / "model.safetensors"), "pt") as f:
        tensors = {k: f.get_tensor(k) for k in f.keys() if k != missing}  # noqa: SIM118
    save_file(tensors, str(out / "model.safetensors"))
    refused(capsys, ["import", str(out), "--out", str(tmp_path / "back")], f"have no {missing}")
    nothing_written(tmp_path, "back")


def test_an_out_under_a_file_is_one_line(tmp_path, capsys):
    run_dir = untrained_run(tmp_path, position="rope")
    (tmp_path / "file").write_text("x")
    assert main(["export", str(run_dir), "--out", str(tmp_path / "hf")]) == 0
    for argv in (
        ["export", str(run_dir), "--out", str(tmp_path / "file" / "hf")],
        ["import", str(tmp_path / "hf"), "--out", str(tmp_path / "file" / "run")],
    ):
        refused(capsys, argv, "--out", "sits under", "a file")
    assert (tmp_path / "file").read_text() == "x"


def test_nothing_replaces_the_folder_it_reads(tmp_path, capsys):
    """Import into its own source, or into a folder above it; export over a folder holding its
    checkpoint: refused before anything is read or replaced."""
    run_dir = untrained_run(tmp_path, position="rope")
    hf = tmp_path / "exports" / "hf"
    assert main(["export", str(run_dir), "--out", str(hf)]) == 0
    before = {p: p.read_bytes() for p in hf.rglob("*") if p.is_file()}
    for out in (hf, tmp_path / "exports" / "." / "hf", tmp_path / "exports"):
        argv = ["import", str(hf), "--out", str(out), "--overwrite"]
        refused(capsys, argv, f"--out {out}", "the model folder", "choose another --out")
    assert {p: p.read_bytes() for p in hf.rglob("*") if p.is_file()} == before
    checkpoint = tmp_path / "exports" / "kept" / "step_00000000"
    shutil.copytree(next((run_dir / "checkpoints").iterdir()), checkpoint)
    argv = [
        "export",
        str(run_dir),
        "--checkpoint",
        str(checkpoint),
        "--out",
        str(checkpoint.parent),
    ]
    refused(capsys, [*argv, "--overwrite"], "holds the checkpoint", "choose another --out")
    refused(capsys, ["export", str(run_dir), "--out", str(run_dir)], "is the run")
    assert checkpoint.is_dir()


def test_lm_import_help_and_the_commands_page_name_every_model_type_the_importer_reads(capsys):
    from lm.hf import MODELS
    from lm.hf.shapes import ARCHITECTURES

    assert set(ARCHITECTURES) == set(MODELS)  # what model_shape accepts
    with pytest.raises(SystemExit):
        main(["--help"])
    listed = " ".join(capsys.readouterr().out.split())
    page = " ".join((Path(__file__).parents[1] / "docs" / "commands.md").read_text().split())
    said = page.split("`lm import` turns", 1)[1].split("folder", 1)[0]
    for name, _ in MODELS.values():
        assert name in listed.split("import turn", 1)[1].split("model folder", 1)[0], name
        assert name in said, name
