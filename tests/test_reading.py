"""The code a student reads stays readable: one forward pass of the default model (RoPE, packed
windows, no cache), and building that model from its config together with one forward, run
through few ``lm`` functions, lines and files, as counted by ``sys.settrace``; and no function in
``lm/`` is over 60 lines (argparse's table aside)."""

import ast
import inspect
import re
import sys
from pathlib import Path

import torch
import yaml

import lm
from lm.config.sections import ModelConfig
from lm.model.transformer import TransformerLM

ROOT = Path(__file__).resolve().parent.parent
LM = str(Path(lm.__file__).parent)


def reading(build: bool) -> tuple[set, int, set]:
    """The ``lm`` functions that one training-mode forward of the default model enters, and with
    ``build`` building that model from its (already checked) config first, each code object
    once, comprehensions and lambdas included; the lines of their source, summed
    (``inspect.getsourcelines``, docstrings and comments included); and their files."""
    settings = yaml.safe_load((ROOT / "configs" / "default.yaml").read_text())["model"]
    config = ModelConfig(vocab_size=96, **settings)
    torch.manual_seed(0)
    ids = torch.randint(0, 96, (2, settings["context_length"]))
    TransformerLM(config).train()(ids)  # what is done once per process (imports, caches) is not
    model = TransformerLM(config).train()
    entered = {}

    def trace(frame, event, arg):
        if frame.f_code.co_filename.startswith(LM):
            entered[frame.f_code] = None
        return None

    sys.settrace(trace)
    try:
        if build:
            model = TransformerLM(config).train()
        model(ids)
    finally:
        sys.settrace(None)
    lines = sum(len(inspect.getsourcelines(code)[0]) for code in entered)
    return set(entered), lines, {code.co_filename for code in entered}


def names(functions: set) -> list[str]:
    return sorted(f"{Path(c.co_filename).name}:{c.co_qualname}" for c in functions)


def test_one_forward_of_the_default_model_reads_in_one_sitting():
    functions, lines, files = reading(build=False)
    assert len(functions) <= 14, names(functions)
    assert lines <= 200, (lines, names(functions))
    assert len(files) <= 6, sorted(files)


def test_building_the_default_model_and_one_forward_read_in_one_sitting():
    # Before the forward's Plan was split into positions and masks: 41 functions, 449 lines and
    # 10 files (nanoGPT: about 12 functions in one file).
    functions, lines, files = reading(build=True)
    assert len(functions) <= 24, names(functions)
    assert lines <= 300, (lines, names(functions))
    assert len(files) <= 6, sorted(files)


LONGEST = 60  # lines, from ``def`` to the function's last line
ASIDE = {("cli.py", "build_parser")}  # argparse's table: one call per flag


def test_no_function_in_lm_is_over_60_lines():
    over = []  # where and how long
    for path in sorted((ROOT / "lm").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                length = node.end_lineno - node.lineno + 1
                if length > LONGEST and (path.name, node.name) not in ASIDE:
                    over.append(f"{path.relative_to(ROOT)}:{node.name} ({length} lines)")
    assert over == []


def test_the_performance_page_states_todays_figures_not_a_log():
    """Each figure once, with where and when it was measured beside its command: no sittings
    to look up and no history (git keeps that)."""
    text = (ROOT / "docs" / "performance.md").read_text(encoding="utf-8")
    assert len(text.splitlines()) <= 250
    assert not re.findall(r"\b[SG]\d+\b", text), "a sitting's label"
    assert not re.search(r"\bsittings?\b|measured again|run again on", text, re.IGNORECASE)
    for section in re.split(r"^## ", text, flags=re.MULTILINE)[1:]:
        heading = section.splitlines()[0]
        if "```" in section or re.search(r"^\|.*\d", section, re.MULTILINE):
            assert re.search(r"\b20\d\d-\d\d-\d\d\b", section), f"{heading}: no date"
            assert re.search(r"\b(EPYC|Xeon|NVIDIA)\b", section), f"{heading}: no machine"


def test_the_readme_names_no_commit_and_no_test_count():
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    assert not re.findall(r"\b(?=[0-9a-f]*[a-f])(?=[0-9a-f]*[0-9])[0-9a-f]{7,40}\b", text)
    assert not re.findall(r"\b\d[\d,]* tests\b", text)
