"""Matplotlib figures of capacity-planning results, drawn without pyplot (no global state, no display
backend: each function returns a `matplotlib.figure.Figure` that `report.py` renders to PNG with Agg).

Inputs are plain data: summaries (`kvsim run --json` keys), per-step tables (`SimResult.steps`) and
tidy DataFrames with one row per run. Memory is shown as percentages of the KV capacity, times in seconds.
Every chart of a metric goes through `metric_lines`, which names the axes, units, title and legend from the
column names (`kvsim.planning.reports.metric_labels`); ratio and count axes start at zero; a chart with nothing
to show says so in words instead of drawing empty axes.
"""

from __future__ import annotations

from typing import Mapping, Sequence

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from kvsim.planning.reports.metric_labels import metric, value_label

#: The five KV states of DESIGN.md's memory accounting, in stacking order, with their colours.
CATEGORIES = ("token_states", "reserved", "internal_fragmentation", "external_fragmentation", "free")
LABELS = {"token_states": "token states", "reserved": "reserved",
          "internal_fragmentation": "internal fragmentation",
          "external_fragmentation": "external fragmentation & others", "free": "free"}
COLOURS = {"token_states": "#2b8cbe", "reserved": "#fdae61", "internal_fragmentation": "#d7191c",
           "external_fragmentation": "#7b3294", "free": "#e0e0e0"}
#: Most points drawn per line of a time series (longer series are thinned evenly).
MAX_POINTS = 2000


def _figure(width: float = 6.4, height: float = 3.6, rows: int = 1) -> tuple[Figure, list]:
    fig = Figure(figsize=(width, height * rows), layout="constrained")
    axes = fig.subplots(rows, 1, squeeze=False)[:, 0]
    return fig, list(axes)


def memory_breakdown(fractions: Mapping[str, Mapping[str, float]], title: str = "") -> Figure:
    """Stacked bars, one per system: the time-averaged fraction of KV capacity in each of the five
    states (`summary["kv"]["mean_fraction"]` per system name).

    >>> import kvsim
    >>> fig = kvsim.plot_memory_breakdown({"paged": {"token_states": 0.9, "free": 0.1}})
    >>> [round(p.get_height()) for p in fig.axes[0].patches]      # percent, one bar per state
    [90, 0, 0, 0, 10]
    """
    names = list(fractions)
    longest = max((len(line) for n in names for line in str(n).splitlines()), default=0)
    fig, (ax,) = _figure(max(4.0, max(1.1, 0.075 * longest) * len(names) + 2.5))   # labels never overlap
    bottom = np.zeros(len(names))
    for cat in CATEGORIES:
        values = np.array([fractions[n].get(cat, 0.0) for n in names]) * 100
        ax.bar(names, values, bottom=bottom, color=COLOURS[cat], label=LABELS[cat], width=0.6)
        bottom += values
    ax.set_ylabel("KV capacity (%, time average)")
    ax.set_ylim(0, 100)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    ax.tick_params(axis="x", labelrotation=0 if any("\n" in n for n in names) else 20, labelsize=8)
    ax.set_title(title or "KV memory breakdown", fontsize=10)
    return fig


def allocated_share(fractions: Mapping[str, float]) -> dict[str, float]:
    """Token states, reserved and internal fragmentation as shares of the allocated KV (not of capacity):
    the memory a request holds, split into what it uses and what it wastes."""
    used = sum(fractions.get(c, 0.0) for c in CATEGORIES[:3])
    return {c: (fractions.get(c, 0.0) / used if used else 0.0) for c in CATEGORIES[:3]}


def _thin(df: pd.DataFrame) -> pd.DataFrame:
    step = max(1, len(df) // MAX_POINTS)
    return df.iloc[::step]


#: Line styles by series: later ones thinner and dashed, so one drawn over an equal one shows both.
_STYLES = ({"lw": 2.2, "ls": "-"}, {"lw": 1.6, "ls": "--"}, {"lw": 1.2, "ls": "-."}, {"lw": 0.9, "ls": ":"},
           {"lw": 0.7, "ls": "-"})


def timeline(steps: Mapping[str, pd.DataFrame], capacity_tokens: Mapping[str, int] | int,
             title: str = "") -> Figure:
    """Two panels against simulated time (s): requests in the batch, and allocated KV (token states +
    reserved + internal fragmentation) as a fraction of capacity, one line per system.

    >>> import kvsim
    >>> r = kvsim.simulate(kvsim.generate_trace("alpaca", num_requests=5, seed=0), kv_gib=1)
    >>> len(kvsim.plot_timeline({"paged": r.steps}, r.summary["kv"]["capacity_tokens"]).axes)
    2
    """
    fig, (top, bottom) = _figure(rows=2, height=2.6)
    for k, (name, df) in enumerate(steps.items()):
        if df.empty:
            continue
        cap = capacity_tokens if isinstance(capacity_tokens, int) else capacity_tokens[name]
        d = _thin(df)
        style = _STYLES[k % len(_STYLES)]    # lines that coincide stay visible: dashes over a solid line
        top.plot(d.time_s, d.running, label=name, **style)
        used = d.token_states + d.reserved + d.internal_fragmentation
        bottom.plot(d.time_s, 100 * used / cap, label=name, **style)
    top.set_ylabel("batch (requests)")
    top.set_ylim(bottom=0)
    bottom.set_ylabel("KV allocated (% of capacity)")
    bottom.set_ylim(0, 105)
    bottom.set_xlabel("simulated time (s)")
    top.legend(fontsize=7, ncols=min(3, max(1, len(steps))))
    top.set_title(title or "Batch size and KV usage over time", fontsize=10)
    return fig


def group_timeline(steps: Mapping[str, pd.DataFrame], groups: Mapping[str, Sequence[Mapping]],
                   title: str = "") -> Figure | None:
    """Per KV cache group against simulated time (s): blocks held (top) and blocks its sliding window or
    chunk has freed so far (bottom), one line per system and group; from steps.csv's `group<j>_blocks`
    and `group<j>_freed` columns, labelled by the summary's `kv.groups`. None when no system has them."""
    fig, (top, bottom) = _figure(rows=2, height=2.6)
    drawn = False
    for name, df in steps.items():
        for j, g in enumerate(groups.get(name) or ()):
            if df.empty or f"group{j}_blocks" not in df:
                continue
            d, drawn = _thin(df), True
            label = f"{name}: {g['kind']} {g.get('window') or g.get('chunk') or ''}".rstrip()
            top.plot(d.time_s, d[f"group{j}_blocks"], label=label, lw=0.9)
            bottom.plot(d.time_s, d[f"group{j}_freed"], label=label, lw=0.9)
    if not drawn:
        return None
    top.set_ylabel("blocks held")
    top.set_ylim(bottom=0)
    bottom.set_ylabel("blocks freed by window")
    bottom.set_xlabel("simulated time (s)")
    top.legend(fontsize=7)
    top.set_title(title or "KV cache groups over time", fontsize=10)
    return fig


def _note(ax, text: str) -> None:
    """Words in place of a chart with nothing to show."""
    ax.text(0.5, 0.5, text, ha="center", va="center", fontsize=12, color="#555", transform=ax.transAxes)
    ax.set_xticks([])
    ax.set_yticks([])
    for side in ax.spines.values():
        side.set_visible(False)


def metric_lines(df: pd.DataFrame, x: str, y: str, hue: str | Sequence[str] | None = None, title: str = "",
                 logx: bool = False, ymax: float | None = None, xlabel: str = "", ylabel: str = "") -> Figure:
    """`y` against `x`, one line per value of `hue` (a column, several columns, or None for one line).
    Axis labels and units come from the column names (`metric_labels.metric`), the title is "<y> against
    <x>" unless given, legend entries name what varies ("block size 16"), fractions are drawn as
    percentages, the y axis starts at zero (`ymax` clips it: the paper's plots stop at 1 s/token).

    >>> import pandas as pd
    >>> df = pd.DataFrame({"block_size": [16, 16, 128], "rate": [1, 2, 1], "ttft_s_p99": [0.1, 0.3, 0.2]})
    >>> ax = metric_lines(df, "rate", "ttft_s_p99", hue="block_size").axes[0]
    >>> ax.get_ylabel(), ax.get_title(), [t.get_text() for t in ax.get_legend().texts], float(ax.get_ylim()[0])
    ('TTFT p99 (s)', 'TTFT p99 against request rate', ['block size 16', 'block size 128'], 0.0)
    """
    fig, (ax,) = _figure()
    xm, ym = metric(x), metric(y)
    hues = [hue] if isinstance(hue, str) else list(hue or [])
    groups = df.groupby(hues, sort=False) if hues else [((), df)]
    scale = 100.0 if ym.percent else 1.0
    for key, g in groups:
        key = key if isinstance(key, tuple) else (key,)
        g = g.sort_values(x)
        label = ", ".join(value_label(h, v) for h, v in zip(hues, key)) or None
        ax.plot(g[x], scale * g[y], marker="o", ms=3, label=label)
    if logx:
        ax.set_xscale("log", base=2)
        ticks = sorted(df[x].unique())
        ax.set_xticks(ticks, [f"{t:g}" for t in ticks])
    ax.set_xlabel(xlabel or xm.axis())
    ax.set_ylabel(ylabel or ym.axis())
    ax.set_ylim(0, ymax)
    if hues and len(df[hues].drop_duplicates()) > 1:
        ax.legend(fontsize=7, title=" / ".join(metric(h).label for h in hues) if len(hues) > 1 else None,
                  title_fontsize=7)
    ax.set_title(title or f"{ym.label[:1].upper()}{ym.label[1:]} against {xm.label}", fontsize=10)
    return fig


def latency_vs_rate(df: pd.DataFrame, system: str = "system", rate: str = "rate_rps",
                    latency: str = "normalized_latency_s_per_token", title: str = "",
                    ymax: float | None = None) -> Figure:
    """A latency metric (default normalized latency, s per output token; any `summary_row` column such as
    `ttft_s_p99`, labelled from its name) against request rate (req/s), one line per `system`.
    `ymax` clips the y axis (the paper's plots stop at 1 s/token) so the knees stay visible.

    >>> import kvsim, pandas as pd
    >>> df = pd.DataFrame({"system": ["a", "a"], "rate_rps": [1, 2],
    ...                    "normalized_latency_s_per_token": [0.03, 0.2]})
    >>> len(kvsim.plot_latency_vs_rate(df).axes[0].lines)
    1
    """
    return metric_lines(df, rate, latency, hue=system, title=title, ymax=ymax)


def block_size_curve(df: pd.DataFrame, title: str = "", recommended: int | None = None) -> Figure:
    """Against block size (tokens, log2 axis): waste (reserved + internal, % of allocated KV) and mean
    batch size on top; throughput (tokens/s) and the indirection cost (% of step time) below.
    Columns: block_size, waste_fraction, mean_batch_size, throughput_tokens_per_s and, when present,
    indirection_fraction.

    >>> import kvsim, pandas as pd
    >>> df = pd.DataFrame({"block_size": [8, 16], "waste_fraction": [0.01, 0.02], "mean_batch_size": [30, 29],
    ...                    "throughput_tokens_per_s": [800, 810]})
    >>> len(kvsim.plot_block_size(df, recommended=16).axes)      # two panels and the batch axis
    3
    """
    fig, (top, bottom) = _figure(rows=2, height=2.6)
    d = df.sort_values("block_size")
    panels = [(top, "waste_fraction", "o", "#d7191c"), (top.twinx(), "mean_batch_size", "s", "#2b8cbe"),
              (bottom, "throughput_tokens_per_s", "o", "k")]
    if "indirection_fraction" in d:
        panels.append((bottom.twinx(), "indirection_fraction", "^", "#7b3294"))
    for ax, col, mark, colour in panels:
        m = metric(col)
        y = (100 if m.percent else 1) * d[col]
        ax.plot(d.block_size, y, marker=mark, ms=3, color=colour)
        ax.set_ylabel(m.axis(), color=colour)
        top_y = float(y.max()) if len(y) and y.max() > 0 else 1.0
        ax.set_ylim(-0.06 * top_y, 1.12 * top_y)     # a line at 0 or at the top clears the axis border
    for ax in (top, bottom):
        ax.set_xscale("log", base=2)
        ax.set_xticks(list(d.block_size), [str(b) for b in d.block_size])
        if recommended is not None:
            ax.axvline(recommended, color="#1a9641", ls="--", lw=1)
    bottom.set_xlabel(metric("block_size").axis()
                      + (f"; dashed: recommended {recommended}" if recommended is not None else ""))
    top.set_title(title or "Waste and throughput against block size", fontsize=10)
    return fig


def bars(values: Mapping[str, float], ylabel: str, title: str, colour: str = "#2b8cbe") -> Figure:
    """Plain bars, one per system (e.g. mean batched requests, preemptions).

    >>> import kvsim
    >>> fig = kvsim.plot_bars({"paged": 30.4, "max": 7.0}, "requests", "batch")
    >>> [float(p.get_height()) for p in fig.axes[0].patches]
    [30.4, 7.0]
    """
    fig, (ax,) = _figure(max(4.0, 1.0 * len(values) + 2.0))
    if not any(values.values()):
        _note(ax, f"no {ylabel.split(' (')[0]} in any run" if values else "no runs")
        ax.set_title(title, fontsize=10)
        return fig
    ax.bar(list(values), list(values.values()), color=colour, width=0.6)
    ax.set_ylabel(ylabel)
    ax.set_ylim(bottom=0)
    ax.tick_params(axis="x", labelrotation=20, labelsize=8)
    ax.set_title(title, fontsize=10)
    return fig


def preemptions(counts: Mapping[str, float], title: str = "") -> Figure:
    """Bars: preemptions per system; none at all is said in words ("no preemptions in any run").

    >>> import kvsim
    >>> len(kvsim.plot_preemptions({"recompute": 12, "swap": 3}).axes[0].patches)
    2
    >>> kvsim.plot_preemptions({"paged": 0}).axes[0].texts[0].get_text()
    'no preemptions in any run'
    """
    return bars(counts, "preemptions", title or "Preemptions per system", "#fdae61")


def lines(df: pd.DataFrame, x: str, y: str, hue: str, xlabel: str = "", ylabel: str = "", title: str = "",
          logx: bool = False) -> Figure:
    """One line per value of `hue`: `y` against `x` (e.g. latency against block size per preemption
    mode); `metric_lines` with the labels it derives unless given."""
    return metric_lines(df, x, y, hue, title=title, logx=logx, xlabel=xlabel, ylabel=ylabel)


def grouped_bars(df: pd.DataFrame, x: str, y: str, hue: str, ylabel: str, title: str,
                 logy: bool = False) -> Figure:
    """Bars of `y` per value of `x` (groups, in order of appearance), one colour per value of `hue`.

    >>> import kvsim, pandas as pd
    >>> from kvsim.planning.reports.figures import grouped_bars
    >>> df = pd.DataFrame({"model": ["a", "a", "b", "b"], "layout": ["u", "h", "u", "h"], "mib": [4, 2, 8, 3]})
    >>> [float(p.get_height()) for p in grouped_bars(df, "model", "mib", "layout", "MiB", "t").axes[0].patches]
    [4.0, 8.0, 2.0, 3.0]
    """
    groups, hues = list(dict.fromkeys(df[x])), list(dict.fromkeys(df[hue]))
    fig, (ax,) = _figure(max(5.0, 1.6 * len(groups) + 2.5))
    width = 0.8 / len(hues)
    for j, h in enumerate(hues):
        sub = df[df[hue] == h].set_index(x)[y]
        ax.bar([i + (j - (len(hues) - 1) / 2) * width for i in range(len(groups))],
               [float(sub.get(g, float("nan"))) for g in groups], width=width, label=str(h))
    ax.set_xticks(range(len(groups)), groups, fontsize=8)
    if logy:
        ax.set_yscale("log")
    ax.set_ylabel(ylabel)
    ax.legend(fontsize=7, title=hue, title_fontsize=7)
    ax.set_title(title, fontsize=10)
    return fig
