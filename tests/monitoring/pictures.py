"""Pictures of what the dashboard's panels showed, drawn with matplotlib from the query results that
tests/e2e/test_monitoring.py saves (.test-results/monitoring/panels.json): one PNG per dashboard row, its panels laid
out as Grafana lays them (their gridPos), each query's series as Grafana would draw them (lines, or bars of the last
value for a bar gauge), labelled by the panel's legend format. Grafana itself is not used (not available here).

    .venv/bin/python -m tests.monitoring.pictures .test-results/monitoring/panels.json docs/images
"""

from __future__ import annotations

import json
import math
import re
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only, no display
import matplotlib.pyplot as plt
from matplotlib.ticker import FuncFormatter

ROWS = {"Jobs": 1, "Waiting": 10, "Progress": 19, "Operator": 41}  # a row's first panels' y (dashboard.py's layout)


def legend(template: str, labels: dict[str, str]) -> str:
    return re.sub(r"\{\{\s*(\w+)\s*\}\}", lambda m: labels.get(m.group(1), ""), template) or "value"


def number(value: str) -> float:
    return float(value) if value not in ("NaN", "+Inf", "-Inf") else math.nan


def formatter(unit: str) -> FuncFormatter:
    def format_value(value: float, _position: int) -> str:
        if unit == "bytes":
            return f"{value / 2**20:.0f} MiB"
        if unit == "percentunit":
            return f"{100 * value:.3g}%"
        if unit == "s":
            return f"{value / 3600:.1f} h" if abs(value) >= 7200 else f"{value:.3g} s"
        return f"{value:.3g}"

    return FuncFormatter(format_value)


def draw(axes, panel: dict) -> None:
    start = panel["start"]
    bars: list[tuple[str, float]] = []
    for target in panel["targets"].values():
        for series in target["series"]:
            name = legend(target["legend"], series["metric"])
            points = [(float(t) - start, number(v)) for t, v in series["values"]]
            if panel["type"] == "bargauge":
                bars.append((name, points[-1][1]))
            else:
                axes.plot([t for t, _ in points], [v for _, v in points], label=name, linewidth=1.2)
    if panel["type"] == "bargauge":
        names = [n for n, _ in bars]
        axes.barh(names, [v for _, v in bars], color="#5794f2")
        axes.xaxis.set_major_formatter(formatter(panel["unit"]))
        axes.invert_yaxis()
        axes.tick_params(axis="y", labelsize=7)
    else:
        axes.yaxis.set_major_formatter(formatter(panel["unit"]))
        axes.set_xlabel("seconds into the job's life", fontsize=7)
        if axes.get_legend_handles_labels()[0]:
            axes.legend(fontsize=6, loc="best")
    axes.set_title(panel["title"], fontsize=9, loc="left")
    axes.tick_params(labelsize=7)
    axes.grid(alpha=0.3)


def render(results: dict, directory: Path) -> list[Path]:
    """One PNG per row: `dashboard-<row>.png`."""
    directory.mkdir(parents=True, exist_ok=True)
    written = []
    tops = sorted(ROWS.items(), key=lambda item: item[1])
    for index, (row, top) in enumerate(tops):
        bottom = tops[index + 1][1] if index + 1 < len(tops) else math.inf
        panels = [(t, p) for t, p in results.items() if top <= p["gridPos"]["y"] < bottom]
        if not panels:
            continue
        height = max(p["gridPos"]["y"] + p["gridPos"]["h"] for _, p in panels) - top
        figure = plt.figure(figsize=(16, 0.42 * height + 0.6))
        grid = figure.add_gridspec(height, 24, hspace=2.5, wspace=3)
        for title, panel in panels:
            g = panel["gridPos"]
            y = g["y"] - top
            axes = figure.add_subplot(grid[y + 1 if y == 0 else y : y + g["h"], g["x"] : g["x"] + g["w"]])
            draw(axes, {**panel, "title": title})
        figure.suptitle(f"kubetf dashboard: {row}", fontsize=11, x=0.01, ha="left")
        path = directory / f"dashboard-{row.lower()}.png"
        figure.savefig(path, dpi=80, bbox_inches="tight")
        plt.close(figure)
        written.append(path)
    return written


if __name__ == "__main__":
    for path in render(json.loads(Path(sys.argv[1]).read_text()), Path(sys.argv[2])):
        print(path)
