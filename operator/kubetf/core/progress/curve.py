"""The terminal chart `kubetf status` draws of a job's progress history (``status.progress.history``)."""

from __future__ import annotations

import itertools
import math
from typing import Any

from kubetf.core.progress.protocol import finite


def _label(value: float) -> str:
    return f"{value:.4g}"


def curve(history: list[dict[str, Any]], metric: str, width: int = 60, height: int = 10) -> str:
    """A small ASCII chart of ``metric`` over the history's steps (else epochs, else report order)."""
    points = [p for p in history or [] if finite(p.get(metric)) is not None]
    if not points:
        return f"{metric}: no values yet"
    if all(isinstance(p.get("step"), int) for p in points):
        axis, xs = "step", [float(p["step"]) for p in points]
    elif all(isinstance(p.get("epoch"), int) for p in points):
        axis, xs = "epoch", [float(p["epoch"]) for p in points]
    else:
        axis, xs = "report", [float(i) for i in range(len(points))]
    ys = [float(p[metric]) for p in points]
    width, height = max(10, width), max(3, height)
    x0, x1, y0, y1 = min(xs), max(xs), min(ys), max(ys)
    if y1 == y0:
        pad = abs(y0) * 0.1 or 1.0
        y0, y1 = y0 - pad, y1 + pad
    grid = [[" "] * width for _ in range(height)]

    def column(x: float) -> int:
        return 0 if x1 == x0 else math.floor((x - x0) / (x1 - x0) * (width - 1) + 0.5)

    def mark(col: int, y: float) -> None:
        grid[height - 1 - math.floor((y - y0) / (y1 - y0) * (height - 1) + 0.5)][col] = "*"

    pairs = sorted(zip(xs, ys, strict=True))
    for (xa, ya), (xb, yb) in itertools.pairwise(pairs):  # a line: every column between two points
        ca, cb = column(xa), column(xb)
        for col in range(ca, cb + 1):
            mark(col, ya if cb == ca else ya + (yb - ya) * (col - ca) / (cb - ca))
    for x, y in pairs:
        mark(column(x), y)
    middle = (height - 1) // 2
    labels = {0: _label(y1), height - 1: _label(y0), middle: _label(y1 - middle / (height - 1) * (y1 - y0))}
    pad_width = max(len(v) for v in labels.values())
    lines = [f"{metric} by {axis}"]
    for i, row_cells in enumerate(grid):
        lines.append(f"{labels.get(i, ''):>{pad_width}} |{''.join(row_cells).rstrip()}")
    lines.append(" " * pad_width + " +" + "-" * width)
    left, right = _label(x0), _label(x1)
    gap = max(1, width - len(left) - len(right))
    lines.append(" " * (pad_width + 2) + left + " " * gap + right + f" {axis}")
    return "\n".join(lines)
