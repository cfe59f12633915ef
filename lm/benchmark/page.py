"""card.html: the card as one offline page, like ``lm view``'s: the table, the length curve
beside the builtins' reference curves and each score's bars, drawn as inline SVG here, with no
script and nothing loaded from any host."""

from __future__ import annotations

import html
import math
from dataclasses import dataclass
from typing import Any

from lm.benchmark import battery as batteries
from lm.benchmark.battery import factor
from lm.benchmark.card import schemes_text, stat_text

MARK = '<meta name="generator" content="lm bench">'
"""How lm knows a page it wrote: this line, within the first bytes of the file."""
COLOURS = {"scheme": "#d1242f", "rope": "#0969da", "best": "#1a7f37", "ref": "#afb8c1"}
STYLE = """
body { font: 14px/1.45 system-ui, sans-serif; margin: 1.5em auto; max-width: 1100px;
  color: #1f2328; padding: 0 1em }
h1 { font-size: 1.4em } h2 { font-size: 1.15em; margin-top: 1.6em }
table { border-collapse: collapse } td, th { padding: 3px 8px; border-bottom: 1px solid #d0d7de }
td.n { text-align: right; font-variant-numeric: tabular-nums; white-space: nowrap }
svg text { font: 11px system-ui, sans-serif; fill: #1f2328 }
.grid { display: grid; grid-template-columns: repeat(auto-fill, minmax(360px, 1fr)); gap: 1em }
figure { margin: 0 } figcaption { font-weight: 600; margin-bottom: 4px }
.axis { stroke: #8c959f } .tick { stroke: #eaeef2 }
.legend span { margin-right: 1.2em } .swatch { display: inline-block; width: 14px; height: 3px;
  vertical-align: middle; margin-right: 4px }
"""


def card_html(card: dict[str, Any]) -> str:
    title = html.escape(f"lm bench: {card['scheme']}")
    seeds = card["seeds"]
    refs = card["references"]
    about = (
        f"The {card['battery']} battery, {len(seeds)} seed{'s' * (len(seeds) > 1)}; against the "
        f"references of {schemes_text(len(refs['schemes']))}"
        + (f" ({'; '.join(refs['machine'])})" if refs["machine"] else "")
    )
    notes = "".join(f"<li>{html.escape(n)}</li>" for n in refs["notes"])
    return (
        '<!DOCTYPE html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n'
        f"{MARK}\n"
        '<meta http-equiv="Content-Security-Policy" content="default-src \'none\'; '
        "style-src 'unsafe-inline'\">\n"
        f"<title>{title}</title>\n<style>{STYLE}</style>\n</head>\n<body>\n"
        f"<h1>{title}</h1>\n<p>{html.escape(about)}.</p>\n"
        + (f'<ul class="notes">{notes}</ul>\n' if notes else "")
        + _table(card)
        + _curve(card)
        + _bars(card)
        + "</body>\n</html>\n"
    )


def _table(card: dict[str, Any]) -> str:
    scores = batteries.scores()
    head = (
        "benchmark",
        "score",
        "this scheme",
        "rank",
        "best builtin",
        "against RoPE",
        "against the best",
    )
    rows = []
    for row in card["scores"]:
        score = scores[row["id"]]
        best = row["best"]
        cells = [
            html.escape(row["benchmark"]),
            html.escape(
                f"{row['score']} ({'higher' if row['higher_is_better'] else 'lower'} is better)"
            ),
            f'<td class="n">{html.escape(stat_text(row, score))}',
            '<td class="n">' + ("n/a" if row["rank"] is None else f"{row['rank']} of {row['of']}"),
            "n/a" if best is None else html.escape(f"{best['scheme']} {stat_text(best, score)}"),
            "n/a" if row["against_rope"] is None else html.escape(row["against_rope"]["said"]),
            "n/a" if row["against_best"] is None else html.escape(row["against_best"]["said"]),
        ]
        rows.append("<tr>" + "".join(c if c.startswith("<td") else f"<td>{c}" for c in cells))
    return (
        '<table id="card"><tr>'
        + "".join(f"<th>{h}" for h in head)
        + "</tr>\n"
        + "\n".join(rows)
        + "\n</table>\n"
    )


@dataclass(frozen=True)
class Frame:
    """The curve's plot: its size in pixels, its margins, and the values its height spans."""

    low: float
    high: float
    last: float
    """log2 of the longest length's multiple: the right end."""
    w: int = 640
    h: int = 340
    left: int = 52
    right: int = 90
    top: int = 12
    bottom: int = 34

    def x(self, length: str) -> float:
        return self.left + (self.w - self.left - self.right) * math.log2(factor(length)) / (
            self.last or 1
        )

    def y(self, value: float) -> float:
        return self.top + (self.h - self.top - self.bottom) * (self.high - value) / (
            self.high - self.low
        )

    def axes(self, lengths: list[str]) -> list[str]:
        """Five loss ticks, the lengths under the plot, the two axes and the x label."""
        w, h, left, right, top, bottom = (
            self.w,
            self.h,
            self.left,
            self.right,
            self.top,
            self.bottom,
        )
        parts = []
        for i in range(5):
            value = self.low + (self.high - self.low) * i / 4
            y = self.y(value)
            parts.append(
                f'<line class="tick" x1="{left}" x2="{w - right}" y1="{y:.1f}" y2="{y:.1f}"/>'
                f'<text x="{left - 6}" y="{y + 4:.1f}" text-anchor="end">{value:.2f}</text>'
            )
        for k in lengths:
            parts.append(
                f'<text x="{self.x(k):.1f}" y="{h - bottom + 16}" text-anchor="middle">{k}</text>'
            )
        parts.append(
            f'<line class="axis" x1="{left}" x2="{left}" y1="{top}" y2="{h - bottom}"/>'
            f'<line class="axis" x1="{left}" x2="{w - right}" y1="{h - bottom}" '
            f'y2="{h - bottom}"/><text x="{(left + w - right) / 2}" y="{h - 4}" '
            'text-anchor="middle">context, as a multiple of the trained one</text>'
        )
        return parts


def _curve(card: dict[str, Any]) -> str:
    """Loss against context (a log scale of the multiple), the scheme in red over the builtins'
    reference curves: RoPE blue, the best at 2x-8x green, the others grey."""
    curve = card["curve"]
    lengths = curve["lengths"]
    mine = {k: v["mean"] for k, v in curve["scheme"].items()}
    loss_row = next((r for r in card["scores"] if r["what"] == "loss"), None)
    best = loss_row["best"]["scheme"] if loss_row and loss_row["best"] else None
    lines = sorted(curve["references"].items(), key=lambda item: item[0] in ("rope", best))
    lines.append((card["scheme"], mine))  # drawn last, on top
    values = [v for _, vs in lines for v in vs.values() if v is not None]
    if not lengths or not values:
        return ""
    pad = (max(values) - min(values)) * 0.05 or 0.05
    frame = Frame(min(values) - pad, max(values) + pad, math.log2(max(map(factor, lengths))))
    parts = [f'<svg id="curve-plot" width="{frame.w}" height="{frame.h}" role="img">']
    parts += frame.axes(lengths)
    drawn = set()
    for name, vs in lines:
        kind = "scheme" if vs is mine else "rope" if name == "rope" else "ref"
        kind = "best" if name == best and vs is not mine else kind
        points = [(frame.x(k), frame.y(vs[k])) if vs.get(k) is not None else None for k in lengths]
        if not any(points):
            continue
        width = {"scheme": 2.5, "ref": 1}.get(kind, 1.6)
        drawn.add(kind)
        parts.append(
            f'<path class="line {kind}" d="{_path(points)}" fill="none" '
            f'stroke="{COLOURS[kind]}" stroke-width="{width}"><title>{html.escape(name)}</title>'
            "</path>"
        )
        if kind != "ref":  # named at its right end
            end = next(k for k in reversed(lengths) if vs.get(k) is not None)
            parts.append(
                f'<text x="{frame.x(end) + 6:.1f}" y="{frame.y(vs[end]) + 4:.1f}" '
                f'style="fill:{COLOURS[kind]}">{html.escape(_short(name))}</text>'
            )
    legend = "".join(
        f'<span><i class="swatch" style="background:{COLOURS[k]}"></i>{label}</span>'
        for k, label in LEGEND
        if k in drawn
    )
    return (
        "<h2>Length curve</h2>\n<p>Validation loss (nats per character) on the embedded corpus "
        "by context; the builtins' curves are their references.</p>\n"
        f'<p class="legend">{legend}</p>\n' + "".join(parts) + "</svg>\n"
    )


LEGEND = (
    ("scheme", "this scheme"),
    ("rope", "RoPE"),
    ("best", "the best at 2x-8x"),
    ("ref", "the other builtins"),
)


def _path(points: list[tuple[float, float] | None]) -> str:
    """An SVG path through the points, broken where one is missing."""
    d, pen = [], "M"
    for point in points:
        if point is None:
            pen = "M"
            continue
        d.append(f"{pen}{point[0]:.1f},{point[1]:.1f}")
        pen = "L"
    return " ".join(d)


def _short(name: str) -> str:
    return name.rpartition(":")[2] if ":" in name else name


def _bars(card: dict[str, Any]) -> str:
    """Each score's bars: the builtins' reference means and the scheme's, best first."""
    figures = []
    for row in card["scores"]:
        entries = list(row["builtins"].items())
        if row["mean"] is not None:
            entries.append((None, row["mean"]))
        entries = [(n, v) for n, v in entries if v is not None]
        if not entries:
            continue
        sign = -1 if row["higher_is_better"] else 1
        entries.sort(key=lambda e: (sign * e[1], e[0] is not None))
        figures.append(_bar_chart(card, row, entries))
    if not figures:
        return ""
    return '<h2>Scores</h2>\n<div class="grid">\n' + "\n".join(figures) + "\n</div>\n"


def _bar_chart(card: dict[str, Any], row: dict[str, Any], entries: list) -> str:
    score = batteries.scores()[row["id"]]
    w, label, value_w, step, top = 360, 130, 58, 16, 4
    h = top + step * len(entries) + 4
    values = [v for _, v in entries]
    # A loss's bars start below the lowest, so that its differences show; the others at 0.
    spread = max(values) - min(values)
    floor = max(0.0, min(values) - 0.5 * spread) if score.what == "loss" and spread else 0
    scale = (1.0 if score.what == "accuracy" else max(values) - floor) or 1.0
    room = w - label - value_w
    parts = [f'<svg class="bars" width="{w}" height="{h}" viewBox="0 0 {w} {h}" role="img">']
    for i, (name, value) in enumerate(entries):
        kind = "scheme" if name is None else "rope" if name == "rope" else "ref"
        y = top + i * step
        width = room * max(value - floor, 0.0) / scale
        shown = f"{_short(card['scheme'])} (this)" if name is None else name
        text = html.escape(score.text(value))
        parts.append(
            f'<text x="{label - 6}" y="{y + 11}" text-anchor="end">{html.escape(shown)}</text>'
            f'<rect class="bar {kind}" x="{label}" y="{y + 2}" width="{width:.1f}" '
            f'height="{step - 4}" fill="{COLOURS[kind]}" data-value="{value!r}"><title>'
            f"{html.escape(shown)}: {text}</title></rect>"
            f'<text x="{label + width + 4:.1f}" y="{y + 11}">{text}</text>'
        )
    parts.append("</svg>")
    way = "higher" if row["higher_is_better"] else "lower"
    caption = f"{row['benchmark']}: {row['score']} ({way} is better)"
    caption += f"; the bars start at {floor:.2f}" if floor else ""
    return f"<figure><figcaption>{html.escape(caption)}</figcaption>{''.join(parts)}</figure>"
