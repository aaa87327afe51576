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

DASHBOARD = Path(__file__).resolve().parents[2] / "helm" / "kubetf" / "dashboards" / "kubetf.json"


def rows() -> dict[str, int]:
    """Each row of the chart's dashboard and the y of its first panels (Grafana's layout: the row's own line + 1)."""
    panels = json.loads(DASHBOARD.read_text())["panels"]
    return {p["title"]: p["gridPos"]["y"] + 1 for p in panels if p["type"] == "row"}


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
        return f"{value:.4g}"

    return FuncFormatter(format_value)


def draw(axes, panel: dict) -> None:
    start, custom = panel["start"], panel.get("custom", {})
    named: list[tuple[str, dict[float, float]]] = []
    quantiles = set()  # a quantile of no observations is NaN: nothing to say about it
    for target in panel["targets"].values():
        for series in target["series"]:
            points = {float(t) - start: number(v) for t, v in series["values"]}
            named.append((legend(target["legend"], series["metric"]), points))
            if "histogram_quantile" in target["expr"]:
                quantiles.add(named[-1][0])
    if panel["type"] == "bargauge":
        bars = [(name, points[max(points)]) for name, points in named]
        axes.barh([n for n, _ in bars], [v for _, v in bars], color="#5794f2")
        axes.xaxis.set_major_formatter(formatter(panel["unit"]))
        axes.invert_yaxis()
        axes.tick_params(axis="y", labelsize=7)
    else:
        times = sorted({t for _, points in named for t in points})
        if (custom.get("stacking") or {}).get("mode") == "normal" and named:
            # Grafana stacks them: a series absent at a step adds nothing there
            layers = [[points.get(t, 0.0) for t in times] for _, points in named]
            axes.stackplot(times, layers, labels=[n for n, _ in named], step="post", alpha=0.7)
        elif custom.get("drawStyle") == "bars":
            width = (times[1] - times[0]) / (len(named) + 1) if len(times) > 1 else 1.0
            for i, (name, points) in enumerate(named):
                axes.bar([t + i * width for t in points], list(points.values()), width=width, label=name)
        else:
            for name, points in named:
                ts = sorted(points)
                line = axes.plot(ts, [points[t] for t in ts], label=name, linewidth=1.2, marker="o", markersize=2.5,
                                 drawstyle="steps-post")[0]  # fmt: skip
                nans = [t for t in ts if math.isnan(points[t])]
                if nans and name not in quantiles:  # Grafana leaves a gap; here a mark says why
                    axes.plot(nans, [0.0] * len(nans), "x", color=line.get_color(), label=f"{name}: NaN")
            finite = [v for _, points in named for v in points.values() if not math.isnan(v)]
            if finite and min(finite) >= 0:
                axes.set_ylim(bottom=0, top=max(finite) * 1.15 or 1)
        axes.yaxis.set_major_formatter(formatter(panel["unit"]))
        axes.set_xlabel("seconds into the job's life", fontsize=7)
        if named:
            axes.set_xlim(0, max(times) + 1)
            axes.legend(fontsize=6, loc="best")
    axes.set_title(panel["title"], fontsize=9, loc="left")
    axes.tick_params(labelsize=7)
    axes.grid(alpha=0.3)


def render(results: dict, directory: Path) -> list[Path]:
    """One PNG per row: `dashboard-<row>.png`."""
    directory.mkdir(parents=True, exist_ok=True)
    written = []
    tops = sorted(rows().items(), key=lambda item: item[1])
    for index, (row, top) in enumerate(tops):
        bottom = tops[index + 1][1] if index + 1 < len(tops) else math.inf
        panels = [(t, p) for t, p in results.items() if top <= p["gridPos"]["y"] < bottom]
        if not panels:
            continue
        height = max(p["gridPos"]["y"] + p["gridPos"]["h"] for _, p in panels) - top
        figure = plt.figure(figsize=(16, 0.6 * height + 0.6))
        grid = figure.add_gridspec(height, 24, hspace=5, wspace=3)
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
