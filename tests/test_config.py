"""Config loading: one-line errors naming the key, overrides, every shipped config loads, the
differences between two configs, and keys read under their old names."""

import dataclasses
import re
from dataclasses import fields
from pathlib import Path

import pytest
from _support import assert_one_line, tiny_config
from hypothesis import given
from hypothesis import strategies as st

from lm.config.errors import ConfigError
from lm.config.load import SECTIONS, config_diff, flatten, load_config, parse_overrides, save_config
from lm.config.sections import Config, ModelConfig, TrainConfig
from lm.config.values import parse_value, split_values
from lm.model.transformer import TransformerLM

ROOT = Path(__file__).parent.parent
CONFIGS = sorted((ROOT / "configs").glob("*.yaml"))


def write(tmp_path, text):
    p = tmp_path / "c.yaml"
    p.write_text(text)
    return p


def test_model_config_works_from_python():
    model = TransformerLM(
        ModelConfig(vocab_size=11, context_length=8, n_layer=1, n_head=1, d_model=8)
    )
    assert model.config.head_dim == 8


@pytest.mark.parametrize(
    "text, message",
    [
        ("model:\n  n_heads: 4\n", "model.n_heads: unknown key (did you mean model.n_head?)"),
        ("model:\n  n_head: four\n", "model.n_head: expected an integer, got 'four'"),
        ("model:\n  d_model: 100\n  n_head: 3\n", "model.n_head: d_model=100 is not divisible"),
        ("model:\n  d_model: 12\n  n_head: 4\n", "head width d_model/n_head=3 must be even"),
        (
            "model:\n  d_model: 7\n  n_head: 1\n  position: sinusoidal\n",
            "sinusoidal needs an even d_model",
        ),
        ("model:\n  n_layer: 0\n", "model.n_layer: must be > 0, got 0"),
        ("model:\n  position: xpose\n", "model.position: 'xpose' is not one of rope, sinusoidal"),
        ("model:\n  position: xpose\n", "dape, path, none (did you mean xpos?)"),
        ("model:\n  kernel: flash\n", "model.kernel: 'flash' is not one of sdpa, flex, math"),
        (
            "model:\n  kernel: flex\n  dropout: 0.1\n",
            "model.kernel: flex has no dropout on attention weights",
        ),
        ("train:\n  lr: fast\n", "train.lr: expected a number, got 'fast'"),
        (
            "train:\n  compile: sometimes\n",
            "train.compile: expected true or false, got 'sometimes' (or leave it out: null)",
        ),
        ("train:\n  batch_size: 10\n  grad_accum: 3\n", "train.grad_accum: batch_size=10"),
        ("optim:\n  lr: 1\n", "optim: unknown section"),
        ("model: 3\n", "model: expected a mapping"),
        ("data:\n  tokenizer: wordpiece\n", "data.tokenizer: 'wordpiece' is not char, byte, bpe"),
        ("data:\n  tokenizer: bpe\n", "data.vocab_size: required with tokenizer: bpe"),
        ("- a\n- b\n", "expected a mapping"),
        ("model: {n_head: [\n", "not a valid safe YAML config"),
        ("!!python/object/apply:os.system ['echo pwned']\n", "not a valid safe YAML config"),
    ],
)
def test_bad_configs_give_one_line_naming_the_key(tmp_path, text, message):
    with pytest.raises(ConfigError) as e:
        load_config(write(tmp_path, text))
    assert_one_line(e, message)


@pytest.mark.parametrize(
    "setting, message",
    [
        ("model.rope_scaling=spiral:4", "model.rope_scaling: 'spiral:4' is not one of none, pi:"),
        ("model.rope_scaling=pi", "model.rope_scaling: 'pi' needs a factor, for example pi:4"),
        ("model.rope_scaling=yarn:four", "the factor of 'yarn:four' is not a number"),
        ("model.rope_scaling=ntk:0", "the factor of 'ntk:0' must be a number >= 1"),
        ("model.rope_scaling=pi:-2", "the factor of 'pi:-2' must be a number >= 1"),
        ("model.rope_scaling=pi:nan", "the factor of 'pi:nan' must be a number >= 1"),
        ("model.rope_fraction=0", "model.rope_fraction: must be in (0, 1], got 0.0"),
        ("model.rope_fraction=0.3", "0.3 of the 8 pairs of a head is 2.4 pairs"),
        ("model.rope_original_context=0", "model.rope_original_context: must be > 0"),
        ("model.scale_embeddings=false", "model.scale_embeddings: applies to position: sinusoidal"),
    ],
)
def test_bad_rope_settings_are_one_line_naming_the_key(setting, message):
    with pytest.raises(ConfigError) as e:
        load_config(None, ["model.d_model=32", "model.n_head=2", setting])
    assert_one_line(e, message)


@pytest.mark.parametrize("position", ["alibi", "sinusoidal", "learned", "none"])
def test_rope_settings_on_another_scheme_are_refused(position):
    ok = load_config(None, [f"model.position={position}", "model.rope_scaling=none"])
    assert ok.model.rope_method == "none"
    for setting, key in [
        ("model.rope_scaling=yarn:4", "model.rope_scaling"),
        ("model.rope_fraction=0.5", "model.rope_fraction"),
        ("model.rope_original_context=64", "model.rope_original_context"),
    ]:
        with pytest.raises(ConfigError) as e:
            load_config(None, [f"model.position={position}", setting])
        assert_one_line(e, key, f"position: {position}" if "scaling" in key else position)


@pytest.mark.parametrize(
    "settings, message",
    [
        (["model.position=t5", "model.t5_buckets=1"], "model.t5_buckets: must be at least 2"),
        (["model.position=t5", "model.t5_max_distance=16"], "must be above t5_buckets/2 = 16"),
        (["model.position=fire", "model.fire_threshold=0"], "model.fire_threshold: must be > 0"),
        (
            ["model.random_positions=128"],
            "model.random_positions: 128 is below model.context_length",
        ),
        (
            ["model.position=none", "model.context_length=8", "model.random_positions=64"],
            "model.random_positions: position: none reads no positions",
        ),
    ],
)
def test_a_schemes_own_keys_are_checked_and_read_by_that_scheme_only(settings, message):
    with pytest.raises(ConfigError) as e:
        load_config(None, settings)
    assert_one_line(e, message)
    assert load_config(None, ["model.position=t5", "model.t5_max_distance=17"]).model.t5_buckets
    # One config may hold them for a sweep over model.position: a RoPE model reads none.
    rope = load_config(None, ["model.fire_threshold=4", "model.t5_buckets=8"]).model
    model = TransformerLM(dataclasses.replace(rope, vocab_size=10, n_layer=1))
    assert not [n for n, _ in model.named_parameters() if ".position." in n]


def test_position_per_layer_as_a_list_or_a_repeated_pattern(tmp_path):
    p = write(tmp_path, "model:\n  n_layer: 4\n  position: [rope, rope, rope, none]\n")
    cfg = load_config(p).model
    assert cfg.layer_positions == ("rope", "rope", "rope", "none")
    assert cfg.position_text == "[rope, rope, rope, none]"
    eight = ["model.n_layer=8", "model.position=[rope,rope,rope,none,...]"]  # NoPE every 4th
    assert load_config(None, eight).model.layer_positions == ("rope", "rope", "rope", "none") * 2
    assert load_config(p, ["model.position=alibi"]).model.layer_positions == ("alibi",) * 4
    # Saved and read back as written.
    save_config(load_config(None, eight), tmp_path / "saved.yaml")
    assert load_config(tmp_path / "saved.yaml").model.position == [
        "rope",
        "rope",
        "rope",
        "none",
        "...",
    ]


@pytest.mark.parametrize(
    "value, message",
    [
        ("[rope,none]", "[rope, none] names 2 schemes for n_layer=4 layers"),
        ("[rope,rope,rope,rope,none]", "names 5 schemes for n_layer=4 layers"),
        ("[rope,rope,none,...]", "repeats 3 schemes, which does not fill n_layer=4 layers"),
        ("[rope,...,none,rope]", "... may only end the list"),
        ("[rope,rope,yarn,none]", "model.position: 'yarn' is not one of rope"),
        ("[rope,learned,rope,rope]", "learned adds to the embeddings, below every layer at once"),
        ("[sinusoidal, rope, ...]", "sinusoidal adds to the embeddings"),
        ("[]", "names no scheme"),
        ("[1,2,3,4]", "model.position: expected a string or a list of names"),
    ],
)
def test_a_bad_per_layer_position_is_one_line(value, message):
    with pytest.raises(ConfigError) as e:
        load_config(None, ["model.n_layer=4", f"model.position={value}"])
    assert_one_line(e, message)


def test_rope_settings_read_as_method_factor_pairs_and_context():
    cfg = load_config(None, ["model.rope_scaling=yarn:2.5", "model.rope_fraction=0.25"]).model
    assert (cfg.rope_method, cfg.rope_factor, cfg.rope_pairs) == ("yarn", 2.5, 4)  # of 16 pairs
    assert cfg.rope_context == cfg.context_length
    cfg = load_config(None, ["model.rope_original_context=64"]).model
    assert (cfg.rope_method, cfg.rope_factor, cfg.rope_context) == ("none", 1.0, 64)


def test_overrides_use_dotted_keys_last_wins_and_same_validation(tmp_path):
    p = write(tmp_path, "model:\n  n_layer: 2\ntrain:\n  lr: 0.001\n")
    cfg = load_config(p, ["model.position=sinusoidal", "train.lr=3e-4", "train.lr=5e-4"])
    assert cfg.model.position == "sinusoidal" and cfg.model.n_layer == 2
    assert cfg.train.lr == 5e-4
    assert load_config(p, ["train.eval_steps=~"]).train.eval_steps is None
    assert load_config(p, ["train.compile=true"]).train.compile is True
    assert load_config(p, ["train.compile=~"]).train.compile is None
    with pytest.raises(ConfigError, match=r"model\.n_head: expected an integer"):
        load_config(p, ["model.n_head=abc"])
    with pytest.raises(ConfigError, match="expected KEY=VALUE"):
        parse_overrides(["train.lr"])
    with pytest.raises(ConfigError, match=r"expected SECTION\.KEY"):
        parse_overrides(["lr=3"])


def test_missing_config_file(tmp_path):
    with pytest.raises(ConfigError, match="no such config file"):
        load_config(tmp_path / "nope.yaml")


def test_train_config_defaults_are_valid():
    assert TrainConfig().schedule == "cosine"


@pytest.mark.parametrize("path", CONFIGS, ids=[p.name for p in CONFIGS])
def test_every_shipped_config_loads(path):
    cfg = load_config(path)
    assert cfg.model.context_length > 0


def test_config_diff_names_each_differing_key_with_both_values_in_declaration_order(tmp_path):
    a = tiny_config()
    b = tiny_config(train={"lr": 1e-3, "seed": 8}, model={"position": "alibi", "vocab_size": 99})
    diff = config_diff(a, b)
    assert diff == {
        "model.vocab_size": (None, 99),
        "model.position": ("rope", "alibi"),
        "train.lr": (3e-3, 1e-3),
        "train.seed": (7, 8),
    }
    assert list(diff) == ["model.vocab_size", "model.position", "train.lr", "train.seed"]
    assert config_diff(b, a)["model.position"] == ("alibi", "rope")
    assert config_diff(a, tiny_config()) == {}
    save_config(b, tmp_path / "b.yaml")  # a config read back from its YAML is the same config
    assert config_diff(b, load_config(tmp_path / "b.yaml")) == {}


def test_flatten_has_every_key_of_every_section_by_dotted_name():
    names = [f"{s}.{f.name}" for s, cls in SECTIONS.items() for f in fields(cls)]
    assert list(flatten(Config())) == names


def test_the_old_name_of_a_key_reads_as_its_new_one(tmp_path):
    # Runs written before model.kernel was named so hold model.attention in their config.yaml.
    assert load_config(write(tmp_path, "model:\n  attention: math\n")).model.kernel == "math"
    assert load_config(None, ["model.attention=flex"]).model.kernel == "flex"
    # The file's old name and the command line's new one are one key: the command line wins.
    old = write(tmp_path, "model:\n  attention: math\n")
    assert load_config(old, ["model.kernel=sdpa"]).model.kernel == "sdpa"
    both = write(tmp_path, "model:\n  attention: math\n  kernel: sdpa\n")
    with pytest.raises(ConfigError, match=r"the old name of model\.kernel, which is also given"):
        load_config(both)


def test_runs_written_before_the_switches_became_booleans_still_load(tmp_path):
    # Older config.yaml files hold compile as the words 'auto', 'true' or 'false'.
    for word, value in (("auto", None), ("true", True), ("false", False)):
        cfg = load_config(
            write(tmp_path, f"train:\n  compile: '{word}'\n  tensorboard: '{word}'\n")
        )
        assert cfg.train.compile is value and cfg.train.tensorboard is value


# Command-line values: parsed as what they say, or refused in one line naming the flag.

NAMES = st.sampled_from(["rope", "none", "alibi", "1e4", "10000", "0.5", "true", "data/a.txt"])
LISTS = st.lists(NAMES, min_size=1, max_size=3).map(lambda names: "[" + ", ".join(names) + "]")
QUOTED = st.sampled_from(['"a,b.txt"', "'x, y'"])


@given(st.lists(st.one_of(NAMES, LISTS, QUOTED), min_size=1, max_size=4))
def test_well_formed_sweep_values_split_back_into_themselves(values):
    for sep in (",", ", ", " , "):
        assert split_values(sep.join(values), "--vary k") == values


@given(st.text(alphabet="ab1 ,[]'\"", max_size=16))
def test_random_sweep_values_split_or_are_refused_in_one_line(text):
    try:
        values = split_values(text, "--vary k")
    except ConfigError as e:
        assert_one_line(e, "--vary k")
        return
    for value in values:  # each piece whole: not empty, brackets paired, quotes closed
        assert value and value == value.strip()
        bare = re.sub(r"'[^']*'|\"[^\"]*\"", "", value)  # what quotes hold is text
        assert bare.count("[") == bare.count("]") and not set(bare) & set("'\"")
    assert ",".join(values).replace(" ", "") == text.replace(" ", "")


@given(st.text(alphabet="ab1 ,[]'\"", max_size=16))
def test_random_set_values_parse_or_are_refused_in_one_line(text):
    try:
        value = parse_value(text, "--set model.position")
    except ConfigError as e:
        assert_one_line(e, "--set model.position")
        return
    if text.strip().startswith("["):  # a list: of its items, each parsed alone
        assert isinstance(value, list)
        assert len(value) == (len(split_values(text.strip()[1:-1], "k")) if value else 0)


@pytest.mark.parametrize(
    ("value", "says"),
    [
        ("[rope,none", "is not a list"),
        ("rope,none]", "is not a list"),
        ("[rope,,none]", "empty value"),
        ("[rope,none,]", "empty value"),
        ("[rope,[none]]", "list inside the list"),
        ("[rope,'none]", "does not close it"),
    ],
)
def test_a_malformed_list_names_its_flag(value, says):
    with pytest.raises(ConfigError, match=re.escape(says)) as e:
        load_config(None, [f"model.position={value}"])
    assert_one_line(e, "--set model.position")


def test_values_yaml_reads_otherwise_are_the_text_given():
    assert parse_value("builtin:") == "builtin:" and parse_value("{a: 1}") == "{a: 1}"
    assert parse_value("[rope, 'x,y']") == ["rope", "x,y"] and parse_value("[]") == []
    with pytest.raises(ConfigError, match=r"data\.source: unknown builtin 'builtin:'"):
        load_config(None, ["data.source=builtin:"])


def test_a_single_task_length_and_messages_say_null(tmp_path):
    copy = ["data.source=builtin:copy", "data.task_eval_lengths=1-10"]
    assert load_config(None, [*copy, "data.task_lengths=8"]).data.task_ranges()[0] == range(8, 9)
    assert load_config(write(tmp_path, "data:\n  source: builtin:copy\n  task_lengths: 3\n"))
    with pytest.raises(ConfigError) as e:
        load_config(None, ["model.n_layer=null"])
    assert "None" not in str(e.value)


def test_random_positions_are_bounded_before_anything_is_allocated():
    with pytest.raises(ConfigError, match="is more than 65,536") as e:
        load_config(None, ["model.random_positions=1000000000"])
    assert_one_line(e, "model.random_positions")
    assert load_config(None, ["model.random_positions=65536"]).model.random_positions == 65536


def test_one_scheme_in_every_layer_is_that_scheme():
    # The same model whichever way it is written: exported, compared and resumed as one.
    for written in ("[rope, rope, rope, rope]", "[rope, ...]", "[alibi, alibi, ...]"):
        model = load_config(None, [f"model.position={written}"]).model
        assert model.position == written.strip("[]").split(",")[0]
        assert isinstance(model.position, str)
    assert load_config(None, ["model.position=[rope, none, ...]"]).model.position == [
        "rope",
        "none",
        "...",
    ]
