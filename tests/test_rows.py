"""A scheme is known by its row (``lm.config.names.SCHEMES``) and its class's hooks, never by its
name: no code in ``lm/`` outside the scheme classes, the table and the exporter's formats asks
whether a model's ``position`` is a literal scheme name. An outside scheme then passes wherever a
builtin does. The rules the rows hold (what a scheme reads, which RoPE extension it takes) are
tested here too."""

import ast
import itertools
from pathlib import Path

import pytest
import torch

from lm.compare import sweep
from lm.compare.measure import Evaluation
from lm.config.errors import ConfigError, LMError
from lm.config.names import POSITIONS, SCHEMES, extends
from lm.config.sections import Config, ModelConfig
from lm.explorer.signal import _sinusoid_chart, undrawn
from lm.model.schemes import SCHEME_CLASSES
from lm.model.schemes.embeddings import sinusoidal_table
from lm.model.transformer import TransformerLM
from lm.training.setup import _check_keys

ROOT = Path(__file__).resolve().parent.parent
LM = ROOT / "lm"

EXEMPT = (
    "lm/model/schemes/",  # the scheme classes: each is its own name
    "lm/config/names.py",  # the table
    # The exporter's formats: which transformers architecture each scheme becomes and how its
    # weights map are keyed by name, each format being one scheme's.
    "lm/hf/export.py",
    "lm/hf/shapes.py",
    "lm/hf/weights.py",
)

POSITION_ATTRS = {"position", "layer_positions", "position_text"}
"""Attributes that hold a model's schemes (``ModelConfig``'s)."""
POSITION_PARAMS = {"position", "positions", "layer_positions"}
"""Parameters that do."""
WRAPPERS = {"set", "frozenset", "tuple", "list", "sorted", "fromkeys", "reversed", "iter", "next"}
"""Calls whose result holds what their argument holds."""


def _names_literal(node: ast.AST) -> str | None:
    """The scheme name a literal is or holds (``"rope"``, ``("none", "learned")``, a dict's key
    or value), or None."""
    if isinstance(node, ast.Constant) and node.value in POSITIONS:
        return node.value
    if isinstance(node, ast.Tuple | ast.List | ast.Set):
        return next((n for e in node.elts if (n := _names_literal(e))), None)
    if isinstance(node, ast.Dict):
        items = [k for k in node.keys if k is not None] + node.values
        return next((n for k in items if (n := _names_literal(k))), None)
    return None


class _Scan(ast.NodeVisitor):
    """Each comparison, set operation, method call, match case and dict lookup between a
    position value and a literal scheme name. A position value is a ``position`` or
    ``layer_positions`` attribute, a ``["position"]`` item, a ``position(s)`` parameter, or a
    name bound from one (assigned, or a loop's item over one), taken through ``set``,
    ``sorted``, an index, ``zip`` or ``enumerate``. Flow-insensitive, per function."""

    def __init__(self, tables: dict[str, str]):
        self.tables = tables  # module names bound to a literal holding a scheme name: that name
        self.tainted: set[str] = set()
        self.found: list[tuple[int, str]] = []

    def holds(self, node: ast.AST | None) -> bool:
        if isinstance(node, ast.Attribute):
            return node.attr in POSITION_ATTRS
        if isinstance(node, ast.Name):
            return node.id in self.tainted
        if isinstance(node, ast.Subscript):
            key = node.slice
            return self.holds(node.value) or (
                isinstance(key, ast.Constant) and key.value == "position"
            )
        if isinstance(node, ast.Starred):
            return self.holds(node.value)
        if isinstance(node, ast.Call):
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            return name in WRAPPERS and any(self.holds(a) for a in node.args)
        if isinstance(node, ast.BinOp):
            return self.holds(node.left) or self.holds(node.right)
        if isinstance(node, ast.Tuple | ast.List | ast.Set):
            return any(self.holds(e) for e in node.elts)
        if isinstance(node, ast.IfExp):
            return self.holds(node.body) or self.holds(node.orelse)
        return False

    def literal(self, node: ast.AST | None) -> str | None:
        """The scheme name ``node`` writes: a literal, or a module's table of literals (as
        ``{"t5_buckets": ("t5",)}``), an item of one, or one through ``set``."""
        if isinstance(node, ast.Name) and node.id in self.tables:
            return self.tables[node.id]
        if isinstance(node, ast.Subscript):
            return self.literal(node.value)
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name | ast.Attribute):
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else func.id
            if name in WRAPPERS:
                return next((n for a in node.args if (n := self.literal(a))), None)
        return _names_literal(node) if node is not None else None

    def bind(self, target: ast.AST, value: ast.AST, item: bool = False) -> None:
        """Taint the names of ``target`` bound from ``value`` (its items when ``item``)."""
        if isinstance(value, ast.Call) and isinstance(value.func, ast.Name) and item:
            if value.func.id == "enumerate" and value.args and isinstance(target, ast.Tuple):
                if len(target.elts) == 2:
                    self.bind(target.elts[1], value.args[0], item=True)
                return
            if value.func.id == "zip" and isinstance(target, ast.Tuple):
                for t, v in zip(target.elts, value.args, strict=False):
                    self.bind(t, v, item=True)
                return
        if not self.holds(value):
            return
        for name in ast.walk(target):
            if isinstance(name, ast.Name):
                self.tainted.add(name.id)

    def flag(self, node: ast.AST, what: str) -> None:
        self.found.append((node.lineno, what))

    def visit_FunctionDef(self, node: ast.FunctionDef) -> None:
        outer, self.tainted = self.tainted, set()
        args = node.args
        for a in [*args.posonlyargs, *args.args, *args.kwonlyargs]:
            if a.arg in POSITION_PARAMS:
                self.tainted.add(a.arg)
        # Bindings first (flow-insensitive): a name bound anywhere in the body holds positions.
        for _ in range(3):
            for sub in ast.walk(node):
                if isinstance(sub, ast.Assign):
                    for t in sub.targets:
                        self.bind(t, sub.value)
                elif isinstance(sub, ast.AnnAssign | ast.NamedExpr) and sub.value is not None:
                    self.bind(sub.target, sub.value)
                elif isinstance(sub, ast.For | ast.comprehension):
                    self.bind(sub.target, sub.iter, item=True)
        self.generic_visit(node)
        self.tainted = outer

    visit_AsyncFunctionDef = visit_FunctionDef

    def visit_Compare(self, node: ast.Compare) -> None:
        sides = [node.left, *node.comparators]
        for left, right in itertools.pairwise(sides):
            for a, b in ((left, right), (right, left)):
                if self.holds(a) and (name := self.literal(b)):
                    self.flag(node, f"compares a position with {name!r}")
        self.generic_visit(node)

    def visit_BinOp(self, node: ast.BinOp) -> None:
        for a, b in ((node.left, node.right), (node.right, node.left)):
            if self.holds(a) and (name := self.literal(b)):
                self.flag(node, f"sets a position against {name!r}")
        self.generic_visit(node)

    def visit_Call(self, node: ast.Call) -> None:
        func = node.func
        if isinstance(func, ast.Attribute):
            parts = [func.value, *node.args]
            if any(self.holds(p) for p in parts) and (
                name := next((n for p in parts if (n := self.literal(p))), None)
            ):
                self.flag(node, f".{func.attr} of a position and {name!r}")
            got = func.attr == "get" and node.args and self.holds(node.args[0])
            if got and self.literal(func.value):
                self.flag(node, "looks a position up in a table of scheme names")
        self.generic_visit(node)

    def visit_Subscript(self, node: ast.Subscript) -> None:
        table = node.value
        keyed = isinstance(table, ast.Dict | ast.Name) and self.literal(table)
        if keyed and self.holds(node.slice):
            self.flag(node, "looks a position up in a table of scheme names")
        self.generic_visit(node)

    def visit_Match(self, node: ast.Match) -> None:
        if self.holds(node.subject):
            for case in node.cases:
                for sub in ast.walk(case.pattern):
                    if isinstance(sub, ast.MatchValue) and (name := _names_literal(sub.value)):
                        self.flag(sub, f"matches a position against {name!r}")
        self.generic_visit(node)


def scheme_names_asked(source: str) -> list[tuple[int, str]]:
    """Every place ``source`` asks a position value for a literal scheme name: (line, what)."""
    tree = ast.parse(source)
    tables = {
        t.id: name
        for node in tree.body
        if isinstance(node, ast.Assign | ast.AnnAssign) and node.value is not None
        if (name := _names_literal(node.value))
        for t in (node.targets if isinstance(node, ast.Assign) else [node.target])
        if isinstance(t, ast.Name)
    }
    scan = _Scan(tables)
    scan.visit(tree)
    return sorted(set(scan.found))


def test_no_code_outside_the_table_asks_a_schemes_name():
    asked = []
    for path in sorted(LM.rglob("*.py")):
        rel = path.relative_to(ROOT).as_posix()
        if rel.startswith(EXEMPT):
            continue
        for line, what in scheme_names_asked(path.read_text(encoding="utf-8")):
            asked.append(f"{rel}:{line}: {what}")
    assert not asked, "\n".join(asked)


@pytest.mark.parametrize(
    "code",
    [
        'def f(model):\n    return model.position == "learned"',
        'def f(model):\n    return model.config.layer_positions[0] != "sinusoidal"',
        'def f(model):\n    return {"none", "learned"} & set(model.config.layer_positions)',
        'def f(positions):\n    return any("rope" in layers for layers in positions)',
        'def f(cfg):\n    names = cfg.layer_positions\n    return [n for n in names if n == "t5"]',
        'def f(c):\n    for i, n in enumerate(c.layer_positions):\n        if n in ("alibi",): ...',
        'def f(keys):\n    return keys["position"] != "learned"',
        'def f(m):\n    return {"rope": 1, "alibi": 2}[m.position]',
        'T = {"rope": 1}\ndef f(m):\n    return T.get(m.position)',
        'def f(m):\n    return set(m.layer_positions).isdisjoint({"cope"})',
        'K = {"t5_buckets": ("t5",)}\ndef f(m, k):\n    return {*m.position} & set(K[k])',
        'def f(m):\n    match m.position:\n        case "fox":\n            return 1',
    ],
)
def test_the_scan_finds_each_way_of_asking_a_name(code):
    assert scheme_names_asked(code), code


@pytest.mark.parametrize(
    "code",
    [
        'def f(m):\n    return m.rope_method != "none"',  # rope_scaling's none, not a scheme
        'def f(m):\n    return m.dape_bias == "alibi"',  # DAPE's static bias, a setting
        "def f(m, SCHEMES):\n    return SCHEMES[m.position].table",  # asking the row
        'def f(path):\n    return path.name == "path"',
        "def f(m, ROTARY):\n    return set(ROTARY) & set(m.layer_positions)",
    ],
)
def test_the_scan_leaves_other_strings_and_the_rows_alone(code):
    assert not scheme_names_asked(code), code


OTHER = {
    "rope_base": 500.0,
    "rope_scaling": "yarn:2",
    "rope_fraction": 0.5,
    "rope_original_context": 8,
    "rope_p": 0.5,
    "xpos_scale_base": 64.0,
    "t5_buckets": 8,
    "t5_max_distance": 16,
    "fire_width": 8,
    "fire_threshold": 64.0,
    "cope_max": 8,
    "dape_bias": "alibi",
    "scale_embeddings": False,
}
"""A value other than the default for every key a row may list."""
SMALL = dict(vocab_size=32, context_length=16, n_layer=2, n_head=2, d_model=16)


class _Reads:
    """A config that records the keys read from it (through its properties too)."""

    def __init__(self, config: ModelConfig):
        object.__setattr__(self, "config", config)
        object.__setattr__(self, "seen", set())

    def __getattr__(self, name: str):
        attr = getattr(type(self.config), name, None)
        if isinstance(attr, property):
            return attr.fget(self)
        self.seen.add(name.lstrip("_"))
        return getattr(self.config, name)


def _built(name: str, **settings) -> dict[str, torch.Tensor]:
    torch.manual_seed(0)
    scheme = SCHEME_CLASSES[name](ModelConfig(position=name, **SMALL, **settings), 0)
    return {**dict(scheme.named_buffers()), **scheme.state_dict()}


def test_every_key_a_row_may_list_has_another_value_here():
    assert set(OTHER) == {key for row in SCHEMES.values() for key in row.keys}


@pytest.mark.parametrize("name", POSITIONS)
def test_a_row_lists_the_keys_its_scheme_reads(name):
    """Each key in the row is read by the class; a key the class reads that the row leaves out
    is refused at another value, or changes nothing the scheme builds."""
    row = SCHEMES[name]
    # an extension's keys are read only where one is set
    extended = {"rope_scaling": "yarn:2"} if "rope_scaling" in row.keys else {}
    reads = _Reads(ModelConfig(position=name, **SMALL, **extended))
    SCHEME_CLASSES[name](reads, 0)
    assert set(row.keys) <= reads.seen
    for key in (reads.seen & set(OTHER)) - set(row.keys):
        try:
            other = _built(name, **{key: OTHER[key]})
        except ConfigError:
            continue
        same = _built(name)
        assert other.keys() == same.keys() and all(torch.equal(other[k], same[k]) for k in same)


@pytest.mark.parametrize("name", POSITIONS)
def test_one_rule_says_which_models_take_a_rope_extension(name):
    """A config, ``lm eval --rope-scaling`` and ``lm compare`` ask ``extends`` alike."""
    takes = extends([name])
    assert takes == ("rope_scaling" in SCHEMES[name].keys)
    if takes:
        ModelConfig(position=name, rope_scaling="pi:2")
        sweep._check_rope([(name, name)])
    else:
        with pytest.raises(ConfigError, match=r"model\.rope_scaling: pi:2 extends RoPE"):
            ModelConfig(position=name, rope_scaling="pi:2")
        with pytest.raises(LMError, match=r"none of the runs uses position: rope or xpos"):
            sweep._check_rope([(name, name)])
    config = Config(model=ModelConfig(position=name))
    measures = Evaluation(rope_scalings=["none", "pi:2"]).measures(config, "ab", "cpu")
    assert [m.rope_scaling for m in measures] == (["none", "pi:2"] if takes else [None])


def test_lm_compare_measures_an_xpos_run_with_rope_extensions():
    # compare once asked for the literal "rope" and refused a sweep of xPos runs
    sweep._check_rope([("xpos",) * 4, ("alibi",) * 4])
    config = Config(model=ModelConfig(position="xpos"))
    assert len(Evaluation(rope_scalings=["none", "yarn:4"]).measures(config, "ab", "cpu")) == 2


def test_init_from_ignores_a_key_no_scheme_of_either_model_reads(tmp_path):
    # dape_bias was compared on every model: a RoPE run could not start from one that had it set
    _check_keys(tmp_path, ModelConfig(dape_bias="alibi"), ModelConfig(), "--init-from")
    dape = ModelConfig(position="dape", dape_bias="alibi")
    with pytest.raises(LMError, match=r"model\.dape_bias is 'alibi' there and 'kerple' here"):
        _check_keys(tmp_path, dape, ModelConfig(position="dape"), "--init-from")


def test_a_key_set_for_a_scheme_that_ignores_it_names_its_readers():
    with pytest.raises(
        ConfigError, match=r"scale_embeddings: applies to position: sinusoidal only"
    ):
        ModelConfig(scale_embeddings=False)
    with pytest.raises(ConfigError, match=r"model\.rope_p: applies to position: rope or xpos only"):
        ModelConfig(position="alibi", rope_p=0.5)
    ModelConfig(position="alibi", t5_buckets=8)  # kept for a sweep over model.position


def test_the_explorer_draws_fixed_embedded_vectors_through_the_schemes_own_embed():
    torch.manual_seed(0)
    model = TransformerLM(ModelConfig(position="sinusoidal", **SMALL)).eval()
    chart = _sinusoid_chart(model, 40)  # past the trained 16: computed, not looked up
    table = sinusoidal_table(40, 16).double()
    expected = [round(float(v), 6) for v in table @ table[0]]  # sum_i cos(n w_i)
    assert chart["series"][0]["y"] == expected
    assert _sinusoid_chart(model, 16)["series"][0]["y"] == expected[:16]  # the kept table's rows
    assert chart["title"].startswith("sinusoidal: the inner product")
    learned = TransformerLM(ModelConfig(position="learned", **SMALL)).eval()
    assert _sinusoid_chart(learned, 8) is None and undrawn(learned)
    assert not undrawn(model)
    assert undrawn(TransformerLM(ModelConfig(position=["rope", "none"], **SMALL)))
