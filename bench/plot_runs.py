"""TensorBoard scalars of several runs as one SVG line chart (no plotting dependency), for the README's curves.

    python bench/plot_runs.py runs/a=grpo runs/b=gigpo --tag eval/accuracy --out docs/curves/alfworld.svg
    python bench/plot_runs.py runs/a --tag train/success_rate --smooth 5 --title "train success"

Each argument is a run directory (the TensorBoard events `run.py` writes), optionally `=label`. `--smooth k` plots
the trailing mean of k points (noisy per-step tags); evals are plotted as logged.
"""

from __future__ import annotations

import argparse
import math
from html import escape
from pathlib import Path

from launch import scalars

COLORS = ("#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#17becf", "#7f7f7f")
W, H, L, R, T, B = 640, 360, 56, 170, 36, 44  # canvas and margins (px)


def read_scalars(run_dir: str, tag: str) -> list[tuple[int, float]]:
    """(step, value) pairs of one tag, sorted by step; the last value wins where a step was logged twice."""
    logged = scalars(run_dir)
    if tag not in logged:
        raise SystemExit(f"{run_dir}: no scalar {tag!r}; it has {sorted(logged)}")
    return sorted(dict(logged[tag]).items())


def smooth(points: list[tuple[int, float]], k: int) -> list[tuple[int, float]]:
    """Each point's value replaced by the mean of it and the k - 1 before it (fewer at the start)."""
    vals = [v for _, v in points]
    windows = [vals[max(0, i - k + 1) : i + 1] for i in range(len(vals))]
    return [(s, sum(w) / len(w)) for (s, _), w in zip(points, windows)]


def _nice_top(top: float) -> float:
    """The y axis' top: 5 ticks of 1, 2 or 5 × 10^k above `top`, so tick labels read 0.05, 0.1, ..."""
    if top <= 0:
        return 1.0
    raw = top / 5
    mag = 10 ** math.floor(math.log10(raw))
    return 5 * next(m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw)


def svg(series: dict[str, list[tuple[int, float]]], title: str, ylabel: str) -> str:
    """A line chart with axes, 5 ticks per axis and a legend on the right."""
    xs = [s for pts in series.values() for s, _ in pts]
    ys = [v for pts in series.values() for _, v in pts]
    x0, x1 = min(xs), max(max(xs), min(xs) + 1)
    y0, y1 = min(0.0, min(ys)), _nice_top(max(ys))
    px = lambda s: L + (s - x0) / (x1 - x0) * (W - L - R)  # noqa: E731
    py = lambda v: H - B - (v - y0) / (y1 - y0) * (H - T - B)  # noqa: E731
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" font-family="sans-serif" font-size="11">',
        f'<rect width="{W}" height="{H}" fill="white"/>',
        f'<text x="{L}" y="20" font-size="13">{escape(title)}</text>',
        f'<line x1="{L}" y1="{H - B}" x2="{W - R}" y2="{H - B}" stroke="black"/>',
        f'<line x1="{L}" y1="{T}" x2="{L}" y2="{H - B}" stroke="black"/>',
        f'<text x="{(L + W - R) / 2}" y="{H - 8}" text-anchor="middle">step</text>',
        f'<text x="14" y="{(T + H - B) / 2}" transform="rotate(-90 14 {(T + H - B) / 2})" '
        f'text-anchor="middle">{escape(ylabel)}</text>',
    ]
    for i in range(6):
        s, v = x0 + (x1 - x0) * i / 5, y0 + (y1 - y0) * i / 5
        out.append(f'<text x="{px(s):.1f}" y="{H - B + 15}" text-anchor="middle">{s:.0f}</text>')
        out.append(f'<text x="{L - 6}" y="{py(v) + 4:.1f}" text-anchor="end">{v:.3g}</text>')
        out.append(f'<line x1="{L}" y1="{py(v):.1f}" x2="{W - R}" y2="{py(v):.1f}" stroke="#e5e5e5"/>')
    for i, (label, pts) in enumerate(series.items()):
        c = COLORS[i % len(COLORS)]
        path = " ".join(f"{px(s):.1f},{py(v):.1f}" for s, v in pts)
        out.append(f'<polyline points="{path}" fill="none" stroke="{c}" stroke-width="1.8"/>')
        if len(pts) <= 30:  # markers only where they stay apart
            out += [f'<circle cx="{px(s):.1f}" cy="{py(v):.1f}" r="2.2" fill="{c}"/>' for s, v in pts]
        y = T + 14 + 16 * i
        out.append(
            f'<line x1="{W - R + 12}" y1="{y - 4}" x2="{W - R + 30}" y2="{y - 4}" stroke="{c}" stroke-width="2"/>'
        )
        out.append(f'<text x="{W - R + 35}" y="{y}">{escape(label)}</text>')
    return "\n".join(out + ["</svg>"]) + "\n"


def main(argv: list[str] | None = None) -> Path:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("runs", nargs="+", help="RUN_DIR or RUN_DIR=label")
    ap.add_argument("--tag", default="eval/accuracy")
    ap.add_argument("--smooth", type=int, default=1, help="trailing mean over k points")
    ap.add_argument("--title", default=None)
    ap.add_argument("--out", default="curve.svg")
    a = ap.parse_args(argv)
    if a.smooth < 1:
        raise SystemExit("--smooth must be >= 1")
    series = {}
    for spec in a.runs:
        run_dir, _, label = spec.partition("=")
        series[label or Path(run_dir).name] = smooth(read_scalars(run_dir, a.tag), a.smooth)
    out = Path(a.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    ylabel = a.tag + (f" (mean of {a.smooth})" if a.smooth > 1 else "")
    out.write_text(svg(series, a.title or a.tag, ylabel))
    print(out)
    return out


if __name__ == "__main__":
    main()
