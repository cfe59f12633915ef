"""Property-based: random configs, --set values, flags and prompts never end in a traceback."""

from __future__ import annotations

from dataclasses import fields

import pytest
from _support import assert_one_line, assert_refused, train_via_cli
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from lm.cli import main
from lm.config.errors import ConfigError
from lm.config.load import SECTIONS, config_from_dict, load_config
from lm.config.sections import Config

NAMES = [f.name for cls in SECTIONS.values() for f in fields(cls)]
DOTTED = [f"{s}.{f.name}" for s, cls in SECTIONS.items() for f in fields(cls)]
VALUES = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(10**12), 10**12),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=12),
    st.lists(st.integers(), max_size=3),
    st.dictionaries(st.text(max_size=4), st.integers(), max_size=2),
)
SECTION_BODY = st.one_of(
    st.dictionaries(st.one_of(st.sampled_from(NAMES), st.text(max_size=8)), VALUES, max_size=6),
    VALUES,
)
CONFIGS = st.one_of(
    st.dictionaries(
        st.one_of(st.sampled_from(list(SECTIONS)), st.text(max_size=6)), SECTION_BODY, max_size=4
    ),
    VALUES,
)
# capsys is read (and so emptied) after every example, so sharing it across examples is safe.
FUZZ = settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))


@FUZZ
@given(CONFIGS)
def test_random_configs_load_or_fail_in_one_line(raw):
    try:
        assert isinstance(config_from_dict(raw), Config)
    except ConfigError as e:
        assert_one_line(e)


@FUZZ
@given(st.one_of(st.sampled_from(DOTTED), st.text(max_size=15)), st.text(max_size=15))
def test_random_set_values_load_or_fail_in_one_line(key, value):
    try:
        load_config(None, [f"{key}={value}"])
    except ConfigError as e:
        assert_one_line(e)


WORDS = st.sampled_from(
    ["train", "sample", "eval", "--set", "--prompt", "--out", "--resume", "--overwrite",
     "--max-new-tokens", "--temperature", "--top-k", "--seed", "--context-lengths",
     "--checkpoint", "--split", "--no-kv-cache", "-", "0", "-1", "nan", "1e9"]
)  # fmt: skip


@FUZZ
@given(st.lists(st.one_of(WORDS, st.text(max_size=8)), max_size=7))
def test_random_command_lines_end_in_a_result_or_one_line(capsys, argv):
    if "--help" in argv or "-h" in argv:
        return
    try:
        code = main(argv)
    except SystemExit as e:
        code = e.code
    err = capsys.readouterr().err
    if code != 0:
        assert_refused(code, err)


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    return train_via_cli(tmp_path_factory.mktemp("fuzz"), max_steps=3)


@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    prompt=st.text(max_size=80),  # any Unicode, empty, longer than the 32-token context
    n=st.integers(1, 6),
    temperature=st.sampled_from(["0", "0.7", "2"]),
)
def test_random_prompts_always_continue(run, capsys, prompt, n, temperature):
    assume(prompt != "-")  # that one reads standard input
    # --prompt=TEXT: a prompt that starts with '-' is otherwise read as a flag, as argparse does
    argv = ["sample", str(run), f"--prompt={prompt}", "--max-new-tokens", str(n)]
    code = main([*argv, "--temperature", temperature, "--seed", "1"])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    assert captured.out.startswith(prompt)


@settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    command=st.sampled_from(["sample", "eval", "attention", "positions"]),
    device=st.one_of(
        st.sampled_from(["gpu", "meta", "cuda:x", "cpu:0", "mps:1", "CPU", "", "cuda:-1", "--"]),
        st.text(max_size=8),
    ),
)
def test_random_devices_run_or_fail_in_one_line(run, capsys, command, device):
    extra = {
        "sample": ["--prompt", "x", "--max-new-tokens", "1"],
        "eval": ["--max-batches", "1"],
        "attention": ["--text", "ab", "--out", str(run / "fuzz.png")],
        "positions": ["--windows", "1", "--out", str(run / "fuzz.png")],
    }[command]
    try:
        code = main([command, str(run), *extra, f"--device={device}"])
    except SystemExit as e:
        code = e.code
    err = capsys.readouterr().err
    if code != 0:
        assert_refused(code, err, "--device")


@settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    parts=st.lists(st.sampled_from(["afile", "dir", "x.png", "x.txt", "y", ".svg"]), max_size=3),
    suffix=st.sampled_from(["", ".png", ".txt", ".pdf", ".jpeg", ".zzz", "/"]),
    command=st.sampled_from(["attention", "positions"]),
)
def test_random_picture_paths_write_or_fail_in_one_line(
    run, tmp_path_factory, capsys, parts, suffix, command
):
    root = tmp_path_factory.mktemp("pictures")
    (root / "afile").write_text("a file")
    (root / "dir").mkdir()
    out = str(root.joinpath(*parts)) + suffix
    extra = ["--text", "ab"] if command == "attention" else ["--windows", "1"]
    try:
        code = main([command, str(run), *extra, "--out", out])
    except SystemExit as e:
        code = e.code
    err = capsys.readouterr().err
    if code != 0:
        assert_refused(code, err, "--out")
    assert (root / "afile").read_text() == "a file"


@settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
@given(raw=st.binary(max_size=12))
def test_random_bytes_as_prompt_or_text_continue_or_fail_in_one_line(run, capsys, raw):
    import os

    text = os.fsdecode(raw)  # what argv holds for these bytes (surrogate-escaped)
    assume(text != "-" and not text.startswith("-"))
    for argv in (
        ["sample", str(run), f"--prompt={text}", "--max-new-tokens", "1"],
        ["attention", str(run), f"--text={text}", "--out", str(run / "fuzz.png")],
    ):
        code = main(argv)
        err = capsys.readouterr().err
        if code != 0:
            assert_refused(code, err)
