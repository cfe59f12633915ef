"""Position schemes written outside lm (docs/positions.md, "Your own scheme"): a ``model.position``
of the form ``path/to/file.py:Class`` (a path relative to the working directory) or
``package.module:Class`` names a class that subclasses ``lm.Scheme`` (or a builtin of
``lm.schemes``) and declares its :class:`~lm.config.names.SchemeRow` on the class.

The config imports it here, once per process, so that its row is known before the model is built
(the config still imports no model module: the class reaches ``lm.Scheme`` through its own
``import lm``). A file is imported under a private module name, ``_lm_scheme_<sha256>``, so that
two files of one name, or a run's copy beside its original, never meet in ``sys.modules``.

A run keeps a copy of each such file (``lm.runs.code``). Loading a run imports its copy only
where :func:`trusting` says so (``--trust-code``, ``trust_code=True``), as transformers asks
``trust_remote_code``: a run's record alone never makes lm run code.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import hashlib
import importlib
import importlib.util
import sys
import traceback
from collections.abc import Iterator
from pathlib import Path

from lm.config.errors import ConfigError
from lm.config.names import OUTSIDE, ROTARY_KEYS, SCHEMES, Place, SchemeRow


class SchemeCodeError(ConfigError):
    """An outside scheme's own code raised: ``frames`` holds its traceback, cut to the frames of
    its file (the rest is lm's), for the command line to print before the one line."""

    def __init__(self, message: str, frames: str = ""):
        super().__init__(message)
        self.frames = frames


@dataclasses.dataclass(frozen=True)
class Loaded:
    """An outside scheme as this process imported it."""

    cls: type
    file: Path
    """The file its class was read from (a run's copy, where it came from a run)."""
    sha256: str


@dataclasses.dataclass(frozen=True)
class RunCode:
    """A run's record of its schemes' code, read while its config loads (:func:`from_run`)."""

    run_dir: Path
    copies: dict[str, tuple[Path, str]]
    """spec -> (the run's copy of its file, the file's sha256 when the run began)."""
    originals: dict[str, Path]
    """spec -> the file it was read from when the run began."""


_LOADED: dict[str, Loaded] = {}
_TRUST = contextvars.ContextVar("trust_code", default=False)
_RUN: contextvars.ContextVar[RunCode | None] = contextvars.ContextVar("run_code", default=None)


@contextlib.contextmanager
def trusting(trust: bool) -> Iterator[None]:
    """Within it, loading a run may import the run's copy of its schemes' code (``trust``, or
    an enclosing ``trusting(True)``: the command line's flag reaches the API it calls)."""
    token = _TRUST.set(trust or _TRUST.get())
    try:
        yield
    finally:
        _TRUST.reset(token)


@contextlib.contextmanager
def from_run(code: RunCode) -> Iterator[None]:
    """Within it, the specs a config names are a run's: read from its copies, or refused."""
    token = _RUN.set(code)
    try:
        yield
    finally:
        _RUN.reset(token)


def is_spec(name: object) -> bool:
    """``model.position`` names a scheme outside lm (``file.py:Class``, ``module:Class``)."""
    return isinstance(name, str) and ":" in name


def canonical(spec: str) -> str:
    """The spec with its file's path made absolute (against the working directory), as a run's
    config.yaml records it; a module's spec as written."""
    where, _, name = spec.rpartition(":")
    if _is_file(where):
        where = str(Path(where).expanduser().resolve())
    return f"{where}:{name}"


def _is_file(where: str) -> bool:
    return where.endswith(".py") or "/" in where or "\\" in where


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def scheme_class(spec: str) -> type:
    """The class of a canonical spec, imported on first use (the config did so already)."""
    if spec not in _LOADED:
        load(spec)
    return _LOADED[spec].cls


def loaded(spec: str) -> Loaded:
    return _LOADED[spec]


def user_files() -> set[str]:
    """The files of every outside scheme loaded, whose frames a traceback shows the user."""
    return {str(item.file) for item in _LOADED.values()}


def load(spec: str) -> SchemeRow:
    """Import the scheme ``spec`` (canonical) names, check its class and row, and register the
    row (:data:`lm.config.names.OUTSIDE`); a run's spec through :func:`_from_run`."""
    run = _RUN.get()
    if run is not None:
        return _from_run(spec, run)
    if spec in _LOADED:
        return OUTSIDE[spec]
    where, _, name = spec.rpartition(":")
    module = _import_file(spec, Path(where)) if _is_file(where) else _import_module(spec, where)
    return _register(spec, module, name)


def _from_run(spec: str, run: RunCode) -> SchemeRow:
    """A run's scheme: the class this command loaded from the same bytes (the user named it:
    a resume, a sweep's own runs), else the run's copy with :func:`trusting`, else refused."""
    where = f"run {run.run_dir}"
    if spec not in run.copies:
        raise ConfigError(
            f"{where}: config.yaml names the scheme {spec}, of which run.json records no copy; "
            "lm imports no code a run names without one"
        )
    copy, recorded = run.copies[spec]
    if spec in _LOADED:
        if _LOADED[spec].sha256 != recorded:
            raise ConfigError(
                f"{where}: its scheme {spec} has changed since the run began (sha256 "
                f"{recorded[:12]} then, {_LOADED[spec].sha256[:12]} now): restore the file (lm "
                f"sample, eval and view read the run's copy, {copy}, with --trust-code)"
            )
        return OUTSIDE[spec]
    if not _TRUST.get():
        raise ConfigError(
            f"{where}: its position scheme {spec.rpartition(':')[2]} is code, {copy}; lm runs "
            "it only with --trust-code (trust_code=True in Python): pass it if you trust the run"
        )
    if not copy.is_file() or sha256(copy) != recorded:
        raise ConfigError(f"{where}: {copy}: the run's copy of {spec} is missing or was changed")
    original = run.originals.get(spec)
    if original is None or not original.is_file() or sha256(original) != recorded:
        state = "has changed" if original is not None and original.is_file() else "is gone"
        print(
            f"lm: note: {original or spec} {state} since {run.run_dir} began; the run reads its "
            f"copy {copy}",
            file=sys.stderr,
        )
    return _register(spec, _import_file(spec, copy), spec.rpartition(":")[2], copy)


def _import_file(spec: str, path: Path):
    if not path.is_file():
        raise ConfigError(f"model.position: {path}: no such file (from {spec})")
    digest = sha256(path)
    name = f"_lm_scheme_{digest[:16]}"
    if name in sys.modules:
        return sys.modules[name]
    found = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(found)
    sys.modules[name] = module  # before it runs: its classes name their module
    try:
        found.loader.exec_module(module)
    except Exception as e:
        del sys.modules[name]
        raise _raised(e, path, "on import") from None
    return module


def _import_module(spec: str, where: str):
    try:
        found = importlib.util.find_spec(where)
    except ModuleNotFoundError as e:
        found, where = None, e.name or where
    if found is None or found.origin is None or not found.origin.endswith(".py"):
        raise ConfigError(f"model.position: {spec}: no module {where} of one Python file")
    try:
        return importlib.import_module(found.name)
    except Exception as e:
        raise _raised(e, Path(found.origin), "on import") from None


def _raised(e: BaseException, path: Path, when: str) -> SchemeCodeError:
    """The error of a scheme's code that raised, with its own frames only."""
    frames = [f for f in traceback.extract_tb(e.__traceback__) if f.filename == str(path)]
    text = "".join(traceback.format_list(frames))
    kind = type(e).__name__
    return SchemeCodeError(f"{path} raised {kind} {when}: {e}", text)


def _register(spec: str, module, name: str, file: Path | None = None) -> SchemeRow:
    file = Path(file or module.__file__)
    cls = getattr(module, name, None)
    where = f"model.position: {spec}"
    if cls is None:
        raise ConfigError(f"{where}: {file} has no class {name}")
    if not _is_scheme(cls):
        raise ConfigError(
            f"{where}: {name} is not a position scheme (subclass lm.Scheme, or a builtin of "
            "lm.schemes)"
        )
    clash = next((c.__dict__["name"] for c in _own(cls) if "name" in c.__dict__), None)
    if clash in SCHEMES:
        raise ConfigError(
            f"{where}: {name} declares name = {clash!r}, a builtin scheme's; an outside scheme "
            "is named by its spec: drop the name"
        )
    row = getattr(cls, "row", None)
    if not isinstance(row, SchemeRow):
        raise ConfigError(f"{where}: {name} declares no row (row = lm.SchemeRow(place=...))")
    if problem := contradiction(row):
        raise ConfigError(f"{where}: its row {problem}")
    row = dataclasses.replace(row, name=spec, code=spec)
    cls.row, cls.place = row, row.place  # found by its spec from here on
    OUTSIDE[spec] = row
    _LOADED[spec] = Loaded(cls, file, sha256(file))
    return row


def _is_scheme(cls: object) -> bool:
    # A class can subclass lm.Scheme only once lm's base module has been imported (by the
    # scheme's own ``import lm``), so the config asks sys.modules and imports no model module.
    base = sys.modules.get("lm.model.schemes.base")
    return isinstance(cls, type) and base is not None and issubclass(cls, base.Scheme)


def _own(cls: type) -> list[type]:
    """The classes of ``cls``'s bases written outside lm."""
    return [c for c in cls.__mro__ if not c.__module__.startswith(("lm.", "torch."))]


def contradiction(row: SchemeRow) -> str | None:
    """What in a row contradicts its place, or None."""
    if row.place not in Place:
        return f"has place {row.place!r}, not a Place"
    rotary = [k for k in row.keys if k in ROTARY_KEYS]
    if rotary and row.place is not Place.QUERIES_AND_KEYS:
        acts = row.place.value
        return f"reads {rotary[0]} (RoPE's angles) but acts on {acts}, not on queries and keys"
    if row.learned_bias and row.place is not Place.SCORES:
        return f"has learned_bias but acts on {row.place.value}, not on the scores"
    if row.wide_keys and row.place is not Place.QUERIES_AND_KEYS:
        return f"has wide_keys but acts on {row.place.value}, not on queries and keys"
    if row.table and row.place is not Place.EMBEDDINGS:
        return f"has a table but acts on {row.place.value}, not on the embeddings"
    return None
