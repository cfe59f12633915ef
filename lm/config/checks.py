"""The checks of ``model`` that span several keys, one method a concern, each raising
:class:`ConfigError` with one line that names the key; and the small helpers every section's
``__post_init__`` checks with. ``ModelConfig`` (lm/config/sections.py) inherits the checks and
calls them in order: each may read what an earlier one set (``layer_positions``,
``_rope_scaling``)."""

from __future__ import annotations

import difflib
from typing import Any

from lm.config.errors import ConfigError
from lm.config.names import (
    MLPS,
    NORMALIZATIONS,
    NORMS,
    POSITIONS,
    Place,
    extends,
    readers,
    row,
)
from lm.config.outside import canonical, is_spec, load
from lm.config.values import parse_rope_scaling, shown, value_text

RANDOM_POSITIONS_MAX = 1 << 16
"""The largest ``model.random_positions``: a step's draw is ``[batch, M]`` numbers sorted."""


UNREAD_REFUSED = ("scale_embeddings", "rope_fraction", "rope_p", "rope_original_context")
"""The scheme keys refused at a value of their own where no layer's scheme reads them (which
schemes read each: the rows' ``keys``); every other scheme key may hold a value for a sweep over
``model.position``, ignored where unread."""

WIDTHS = {"head_dim": "head width d_model/n_head", "d_model": "d_model"}  # SchemeRow.even's


def choice(section: str, name: str, value: Any, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        close = difflib.get_close_matches(value, allowed, n=1) if isinstance(value, str) else []
        hint = f" (did you mean {close[0]}?)" if close else ""  # a typo, as an unknown key's
        raise ConfigError(
            f"{section}.{name}: {shown(value)} is not one of {', '.join(allowed)}{hint}"
        )


def positive(section: str, obj: Any, *names: str, allow_zero: bool = False) -> None:
    for name in names:
        value = getattr(obj, name)
        if value is None:
            continue
        if value < 0 or (value == 0 and not allow_zero):
            bound = ">= 0" if allow_zero else "> 0"
            raise ConfigError(f"{section}.{name}: must be {bound}, got {shown(value)}")


def per_layer(value: Any, n_layer: int) -> tuple[Any, ...]:
    """A setting per layer: one value for all, or a list, one ending in ``...`` repeated to
    ``n_layer`` (the config checked that it divides)."""
    if not isinstance(value, list):
        return (value,) * n_layer
    items = [v for v in value if v != "..."]
    return tuple(items * (n_layer // len(items)))


def layer_items(key: str, value: Any, n_layer: int, noun: str) -> list[Any]:
    """The items of ``model.KEY`` given per layer, a scalar being one for every layer: a list of
    one per layer, or one ending in ``...`` whose items repeat to fill ``n_layer``."""
    if not isinstance(value, list):
        return [value]
    text = value_text(value)
    repeat = value[-1:] == ["..."]
    items = value[:-1] if repeat else list(value)
    again = "give one per layer, or end the list with ... to repeat it"
    if not items:
        raise ConfigError(f"model.{key}: {text} names no {noun}; {again}")
    if "..." in items:
        raise ConfigError(f"model.{key}: {text}: ... may only end the list")
    if repeat and n_layer % len(items):
        raise ConfigError(
            f"model.{key}: {text} repeats {len(items)} {noun}s, which does not fill "
            f"n_layer={n_layer} layers"
        )
    if not repeat and len(items) != n_layer:
        raise ConfigError(
            f"model.{key}: {text} names {len(items)} {noun}s for n_layer={n_layer} layers; {again}"
        )
    return items


class ModelChecks:
    """The checks of ``model`` that span several keys, one method a concern; ``ModelConfig``
    inherits them and its ``__post_init__`` calls them in order."""

    def _check_widths(self) -> None:
        """The widths each scheme splits into pairs (its row's ``even``) are even."""
        for name in dict.fromkeys(self.layer_positions):
            for width in row(name).even:
                if getattr(self, width) % 2:
                    label, value = WIDTHS.get(width, width), getattr(self, width)
                    raise ConfigError(
                        f"model.position: {name} needs an even {label} (it pairs features): "
                        f"{label}={value} must be even"
                    )

    def _check_block(self) -> None:
        """The block's norm, MLP and key/value heads."""
        choice("model", "norm", self.norm, NORMS)
        choice("model", "mlp", self.mlp, MLPS)
        if self.mlp == "none" and self.d_ff is not None:
            raise ConfigError(
                f"model.d_ff: {self.d_ff} sets the width of an MLP, and model.mlp: none has none"
            )
        if self.n_kv_head is None:
            return
        if self.n_kv_head < 1 or self.n_kv_head > self.n_head:
            raise ConfigError(
                f"model.n_kv_head: must be from 1 to n_head={self.n_head} (key/value heads, each "
                f"read by n_head / n_kv_head query heads), got {self.n_kv_head}"
            )
        if self.n_head % self.n_kv_head:
            raise ConfigError(
                f"model.n_kv_head: n_head={self.n_head} is not a multiple of n_kv_head="
                f"{self.n_kv_head} (each key/value head serves a whole group of query heads)"
            )

    def _check_normalize(self) -> None:
        """A normalization that runs with this model's kernel and schemes."""
        choice("model", "normalize", self.normalize, NORMALIZATIONS)
        if self.normalize == "stick_breaking":
            others = sorted(r.name for r in self.rows if r.place is not Place.NOTHING)
            if others:
                raise ConfigError(
                    f"model.normalize: stick_breaking is its own position signal (Tan et al. use "
                    f"no position scheme with it); set position: none, not {others[0]}"
                )
            if self.kernel == "flex":
                raise ConfigError(
                    "model.kernel: flex computes a softmax; stick_breaking runs as the notes' "
                    "explicit formula does (kernel: sdpa or math)"
                )
        flexless = [r.name for r in self.rows if not r.flex]
        if self.kernel == "flex" and flexless:
            raise ConfigError(
                f"model.kernel: flex cannot compute {flexless[0]}'s bias, which reads more than "
                "the one query-key pair a score function sees; use sdpa"
            )

    def _check_window(self) -> None:
        """One window, or one per layer: each a whole number of keys from 1 to the context."""
        for w in layer_items("window", self.window, self.n_layer, "window"):
            if w is not None and (not isinstance(w, int) or isinstance(w, bool) or w < 1):
                raise ConfigError(f"model.window: {shown(w)} is not a number of keys >= 1")
            if w is not None and w > self.context_length:
                raise ConfigError(
                    f"model.window: {w} is more than model.context_length={self.context_length}: "
                    "a window that long reads every key (write null)"
                )

    def _check_random_positions(self) -> None:
        M = self.random_positions
        if M is None:
            return
        if M > RANDOM_POSITIONS_MAX:
            raise ConfigError(
                f"model.random_positions: {M} is more than {RANDOM_POSITIONS_MAX:,}: every "
                "training step draws each sequence's positions from a random order of all M, and "
                "RoPE's angles (or a learned table) hold M rows"
            )
        if self.context_length > M:
            raise ConfigError(
                f"model.random_positions: {M} is below model.context_length="
                f"{self.context_length}; training draws a sequence's positions from [0, M), so "
                "M must be at least the longest sequence"
            )
        if not any(r.reads_positions for r in self.rows):
            text = self.position_text  # none, fox or cope: no position is read
            raise ConfigError(f"model.random_positions: position: {text} reads no positions")

    def _check_random_positions_eval(self) -> None:
        if self.random_positions_eval and self.random_positions is None:
            raise ConfigError(
                "model.random_positions_eval: draws model.random_positions at evaluation too; "
                "set model.random_positions (M) first"
            )

    def _check_position(self) -> None:
        """One scheme, or one per layer (read back as ``layer_positions``); a scheme outside lm
        by its spec, made absolute, its class imported and its row checked
        (:mod:`lm.config.outside`)."""
        if isinstance(self.position, str):
            object.__setattr__(self, "position", self._scheme(self.position))
            return
        text = value_text(self.position)
        names = [
            self._scheme(n) for n in layer_items("position", self.position, self.n_layer, "scheme")
        ]
        if len(set(names)) == 1:
            # One scheme in every layer ([rope, ...]) is that scheme, exported and resumed as it.
            object.__setattr__(self, "position", names[0])
            return
        object.__setattr__(self, "position", [self._scheme(n) for n in self.position])
        for name in names:
            if row(name).place is Place.EMBEDDINGS:
                raise ConfigError(
                    f"model.position: {text}: {name} adds to the embeddings, below every layer "
                    f"at once, and cannot be chosen per layer (write position: {name})"
                )

    def _scheme(self, name: Any) -> Any:
        """A builtin's name as it is; an outside scheme's spec made absolute, loaded, its row's
        widths and keys checked against this config."""
        if name == "..." or not is_spec(name):
            if name != "...":
                choice("model", "position", name, POSITIONS)
            return name
        spec = canonical(name)
        scheme = load(spec)
        for key in (*scheme.even, *scheme.keys):
            if key not in self.__dataclass_fields__ and not hasattr(type(self), key):
                raise ConfigError(f"model.position: {spec}: its row names {key}, no model key")
        for width in scheme.even:
            if not isinstance(getattr(self, width), int):
                raise ConfigError(f"model.position: {spec}: its row's even names {width}, no width")
        return spec

    def _check_scheme_keys(self) -> None:
        """Each scheme's keys within its range; read only by a model that uses their scheme (as
        ``rope_base``), so that one config can hold them for a sweep over ``model.position``."""
        choice("model", "dape_bias", self.dape_bias, ("kerple", "alibi"))
        positive("model", self, "fire_width", "fire_threshold", "xpos_scale_base", "cope_max")
        if self.t5_buckets < 2:
            raise ConfigError(f"model.t5_buckets: must be at least 2, got {self.t5_buckets}")
        if self.t5_max_distance <= self.t5_buckets // 2:
            raise ConfigError(
                f"model.t5_max_distance: must be above t5_buckets/2 = {self.t5_buckets // 2} "
                f"(the distances with a bucket each), got {self.t5_max_distance}"
            )

    def _check_rope(self) -> None:
        """RoPE's own keys within their range, and the keys of :data:`UNREAD_REFUSED` and a
        context extension set only where a layer's scheme reads them. ``rope_scaling`` is parsed
        here, once, into ``rope_method`` and ``rope_factor``."""
        object.__setattr__(self, "_rope_scaling", parse_rope_scaling(self.rope_scaling))
        positive("model", self, "rope_original_context")
        for name in ("rope_fraction", "rope_p"):
            if not 0.0 < getattr(self, name) <= 1.0:
                raise ConfigError(f"model.{name}: must be in (0, 1], got {getattr(self, name)!r}")
        for name in UNREAD_REFUSED:
            unset = getattr(self, name) == self.__dataclass_fields__[name].default
            if not (unset or readers(name, self.layer_positions)):
                raise ConfigError(
                    f"model.{name}: applies to position: {' or '.join(readers(name))} only (this "
                    f"model uses {self.position_text})"
                )
        if not extends(self.layer_positions):
            if self.rope_method != "none":
                raise ConfigError(
                    f"model.rope_scaling: {self.rope_scaling} extends RoPE; this model uses "
                    f"position: {self.position_text}"
                )
            return
        if self.rope_fraction != 1.0 and self.rope_p != 1.0:
            raise ConfigError(
                "model.rope_p: p-RoPE keeps the fastest pairs at their frequencies, rope_fraction "
                "re-spaces the frequencies of the first pairs; set one of them"
            )
        for name in ("rope_fraction", "rope_p"):
            share = getattr(self, name)
            pairs = share * self.head_dim / 2
            if round(pairs) < 1 or abs(pairs - round(pairs)) > 1e-6:
                raise ConfigError(
                    f"model.{name}: {share} of the {self.head_dim // 2} pairs of a head is "
                    f"{pairs:g} pairs; choose a fraction that gives a whole number >= 1"
                )
