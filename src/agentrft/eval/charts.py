"""Inline SVG charts for the HTML report: no JavaScript library, no network.

Every label goes through `html.escape`; the charts are plain strings so the
report stays one self-contained file that renders with scripts disabled.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from html import escape

PALETTE = ("#2563eb", "#dc2626", "#16a34a", "#9333ea", "#ea580c", "#0891b2", "#4b5563", "#ca8a04")
_W, _H = 560, 260
_L, _R, _T, _B = 56, 16, 28, 44  # margins: left axis labels, legend on top, x labels below


def _nice_ticks(lo: float, hi: float, n: int = 5) -> list[float]:
    if hi <= lo:
        hi = lo + 1.0
    raw = (hi - lo) / n
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw)
    start = math.floor(lo / step) * step
    ticks, v = [], start
    while v <= hi + step * 1e-9:
        ticks.append(round(v, 10))
        v += step
    return ticks


def _fmt(v: float) -> str:
    if v == int(v) and abs(v) < 1e6:
        return str(int(v))
    return f"{v:.3g}"


def _frame(title: str, y_ticks: list[float], y_of: object, x_labels: list[tuple[float, str]]) -> list[str]:
    parts = [f'<text class="chart-title" x="{_L}" y="16">{escape(title)}</text>']
    for t in y_ticks:
        y = y_of(t)  # type: ignore[operator]
        parts.append(f'<line class="grid" x1="{_L}" x2="{_W - _R}" y1="{y:.1f}" y2="{y:.1f}"/>')
        parts.append(f'<text class="tick" x="{_L - 6}" y="{y + 4:.1f}" text-anchor="end">{escape(_fmt(t))}</text>')
    for x, label in x_labels:
        parts.append(f'<text class="tick" x="{x:.1f}" y="{_H - _B + 16}" text-anchor="middle">{escape(label)}</text>')
    parts.append(f'<line class="axis" x1="{_L}" x2="{_W - _R}" y1="{_H - _B}" y2="{_H - _B}"/>')
    return parts


def _legend(names: Sequence[str]) -> list[str]:
    parts, x = [], _L
    for i, name in enumerate(names):
        color = PALETTE[i % len(PALETTE)]
        parts.append(
            f'<rect x="{x}" y="{_H - 14}" width="10" height="10" fill="{color}"/>'
            f'<text class="legend" x="{x + 14}" y="{_H - 5}">{escape(name)}</text>'
        )
        x += 24 + 7 * len(name)
    return parts


def line_chart(
    title: str,
    series: Mapping[str, Sequence[tuple[float, float]]],
    *,
    x_label: str = "step",
    y_range: tuple[float, float] | None = None,
    marks: Sequence[tuple[float, str]] = (),
) -> str:
    """Lines of (x, y) points, one per named series; empty series are skipped. ``marks``: (x, label) points
    drawn as dashed vertical lines (e.g. a tripwire that fired at that step)."""
    series = {k: sorted(v) for k, v in series.items() if v}
    if not series:
        return f'<p class="empty">{escape(title)}: no data</p>'
    xs = [x for pts in series.values() for x, _ in pts]
    ys = [y for pts in series.values() for _, y in pts]
    x0, x1 = min(xs), max(xs)
    y0, y1 = y_range if y_range else (min(0.0, min(ys)), max(ys))
    y_ticks = _nice_ticks(y0, y1)
    y0, y1 = min(y_ticks[0], y0), max(y_ticks[-1], y1)
    span_x = (x1 - x0) or 1.0

    def px(x: float) -> float:
        return _L + (x - x0) / span_x * (_W - _L - _R)

    def py(y: float) -> float:
        return _H - _B - (y - y0) / ((y1 - y0) or 1.0) * (_H - _B - _T)

    x_ticks = _nice_ticks(x0, x1, 6) if x1 > x0 else [x0]
    if all(x == int(x) for x in xs):  # steps and k are integers: no 1.5th step
        x_ticks = sorted({float(round(t)) for t in x_ticks})
    parts = _frame(title, y_ticks, py, [(px(t), _fmt(t)) for t in x_ticks if x0 <= t <= x1])
    for x, label in marks:
        if x0 <= x <= x1:
            parts.append(
                f'<line class="mark" x1="{px(x):.1f}" x2="{px(x):.1f}" y1="{py(y1):.1f}" y2="{py(y0):.1f}" '
                f'stroke="#c00" stroke-dasharray="4 3"><title>{escape(label)} @ {escape(x_label)} {escape(_fmt(x))}'
                "</title></line>"
            )
    for i, (name, pts) in enumerate(series.items()):
        color = PALETTE[i % len(PALETTE)]
        coords = " ".join(f"{px(x):.1f},{py(y):.1f}" for x, y in pts)
        parts.append(
            f'<polyline class="series" data-series="{escape(name)}" fill="none" stroke="{color}" '
            f'stroke-width="2" points="{coords}"/>'
        )
        for x, y in pts:
            parts.append(
                f'<circle cx="{px(x):.1f}" cy="{py(y):.1f}" r="2.5" fill="{color}">'
                f"<title>{escape(name)} @ {escape(x_label)} {escape(_fmt(x))}: {y:.4g}</title></circle>"
            )
    parts += _legend(list(series))
    return _svg(title, parts)


def bar_chart(
    title: str,
    categories: Sequence[str],
    series: Mapping[str, Sequence[float]],
    *,
    y_range: tuple[float, float] | None = None,
    percent: bool = False,
) -> str:
    """Grouped vertical bars: one group per category, one bar per named series."""
    if not categories or not series:
        return f'<p class="empty">{escape(title)}: no data</p>'
    values = [v for vs in series.values() for v in vs]
    y0, y1 = y_range if y_range else (0.0, max([*values, 1e-09]))
    y_ticks = _nice_ticks(y0, y1)
    y1 = max(y_ticks[-1], y1)

    def py(y: float) -> float:
        return _H - _B - (y - y0) / ((y1 - y0) or 1.0) * (_H - _B - _T)

    group_w = (_W - _L - _R) / len(categories)
    bar_w = group_w * 0.8 / len(series)
    labels = [(_L + (i + 0.5) * group_w, c if len(c) <= 14 else c[:13] + "…") for i, c in enumerate(categories)]
    parts = _frame(title, y_ticks, py, labels)
    for j, (name, vs) in enumerate(series.items()):
        color = PALETTE[j % len(PALETTE)]
        for i, v in enumerate(vs):
            x = _L + i * group_w + group_w * 0.1 + j * bar_w
            y = py(max(v, y0))
            shown = f"{v:.0%}" if percent else f"{v:.4g}"
            parts.append(
                f'<rect class="bar" x="{x:.1f}" y="{y:.1f}" width="{bar_w:.1f}" '
                f'height="{max(0.0, _H - _B - y):.1f}" fill="{color}"><title>{escape(name)} · '
                f"{escape(categories[i])}: {shown}</title></rect>"
            )
    parts += _legend(list(series))
    return _svg(title, parts)


def _svg(title: str, parts: list[str]) -> str:
    return (
        f'<svg class="chart" viewBox="0 0 {_W} {_H}" width="{_W}" height="{_H}" role="img" '
        f'aria-label="{escape(title)}" xmlns="http://www.w3.org/2000/svg">' + "".join(parts) + "</svg>"
    )
