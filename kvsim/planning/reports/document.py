"""A report as a list of blocks (headings, paragraphs, tables, figures), written to a folder as Markdown
plus a self-contained HTML page (figures inlined as base64 PNG), the PNGs and each table as CSV.

The folder is written whole or not at all: everything goes to a temporary sibling folder that is renamed
into place at the end. An existing folder is an error unless `force` (then it is replaced).
"""

from __future__ import annotations

import base64
import numbers
import html
import io
import json
import os
import re
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping, Sequence

import numpy as np
import pandas as pd
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from kvsim.planning.reports.metric_labels import metric

#: PNG resolution of saved figures (dots per inch): small enough to commit example reports.
DPI = 80


class ReportExistsError(ValueError):
    """The output folder exists and `force` was not given."""


@dataclass
class Report:
    """An ordered document: add blocks with `heading`, `paragraph`, `table` and `figure`.

    >>> import kvsim, pandas as pd, tempfile, pathlib
    >>> rep = kvsim.Report("Plan")
    >>> rep.paragraph("OPT-13B fits **7** requests at 2,048 tokens.")
    >>> rep.table("t", pd.DataFrame({"allocator": ["paged"], "blocks": [983]}))
    >>> rep.figure("f", kvsim.plot_bars({"paged": 983}, "blocks", "KV blocks"))
    >>> out = kvsim.write_report(rep, pathlib.Path(tempfile.mkdtemp()) / "plan")
    >>> sorted(p.name for p in out.iterdir())
    ['data', 'figures', 'provenance.json', 'report.html', 'report.md']
    """

    title: str
    blocks: list[tuple] = field(default_factory=list)

    def heading(self, text: str) -> None:
        self.blocks.append(("h", text))

    def paragraph(self, text: str) -> None:
        """Markdown text: inline `code` and **bold**; lines starting with '- ' make a list."""
        self.blocks.append(("p", text.strip()))

    def table(self, name: str, df: pd.DataFrame, caption: str = "", show: Mapping[str, str] | None = None,
              percent: Sequence[str] = ()) -> None:
        """A table, written whole as `data/<name>.csv`; the page shows the columns of `show` (column ->
        header; default all, as named) with thousands separators, 3-4 significant digits and never an
        exponent; fraction columns (`percent`, or a name `metric_labels` knows as a fraction) as %."""
        df = df.reset_index(drop=True)
        shown = df[list(show)].rename(columns=dict(show)) if show else df
        pct = {(show or {}).get(c, c) for c in df.columns if c in percent or metric(str(c)).percent}
        self.blocks.append(("t", name, df, caption, shown, frozenset(pct)))

    def figure(self, name: str, fig: Figure, caption: str = "") -> None:
        """A figure, saved as `figures/<name>.png`."""
        self.blocks.append(("f", name, fig, caption))

    def markdown(self) -> str:
        out = [f"# {self.title}", ""]
        for block in self.blocks:
            kind = block[0]
            if kind == "h":
                out += [f"## {block[1]}", ""]
            elif kind == "p":
                out += [block[1], ""]
            elif kind == "t":
                _, name, _, caption, shown, pct = block
                out += ([f"*{caption}*", ""] if caption else []) + [_md_table(shown, pct), ""]
            else:
                _, name, _, caption = block
                out += [f"![{caption or name}](figures/{name}.png)", ""]
                if caption:
                    out += [f"*{caption}*", ""]
        return "\n".join(out)

    def html(self, pngs: dict[str, bytes]) -> str:
        body = [f"<h1>{html.escape(self.title)}</h1>"]
        for block in self.blocks:
            kind = block[0]
            if kind == "h":
                body.append(f"<h2>{html.escape(block[1])}</h2>")
            elif kind == "p":
                body.append(_html_text(block[1]))
            elif kind == "t":
                _, name, _, caption, shown, pct = block
                cap = f"<caption>{_inline(caption)}</caption>" if caption else ""
                rows = "".join("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in r) + "</tr>"
                               for r in _cells(shown, pct))
                head = "".join(f"<th>{html.escape(str(c))}</th>" for c in shown.columns)
                body.append(f'<div class="wide"><table>{cap}<tr>{head}</tr>{rows}</table></div>')
            else:
                _, name, _, caption = block
                data = base64.b64encode(pngs[name]).decode("ascii")
                alt = html.escape(caption or name)
                body.append(f'<figure><img alt="{alt}" src="data:image/png;base64,{data}">'
                            + (f"<figcaption>{_inline(caption)}</figcaption>" if caption else "")
                            + "</figure>")
        return (f"<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\"><title>{html.escape(self.title)}"
                f"</title>\n<style>{_CSS}</style></head>\n<body>\n" + "\n".join(body) + "\n</body></html>\n")


_CSS = ("body{font-family:sans-serif;max-width:60em;margin:2em auto;padding:0 1em;line-height:1.4}"
        ".wide{overflow-x:auto;max-width:100%}"
        "table{border-collapse:collapse;margin:1em 0;font-size:90%}td,th{border:1px solid #ccc;"
        "padding:2px 6px;text-align:right}caption{font-style:italic;text-align:left}"
        "img{max-width:100%}figcaption{font-style:italic;font-size:90%}code{background:#f4f4f4}")


def _fmt(v) -> str:
    """A table cell: integers with thousands separators; floats with 4 significant digits, whole numbers
    from 1,000 on, small ones written out (0.0000044, never 4.4e-06); NaN as '-'.

    >>> [_fmt(v) for v in (15273, 15273.75, 17.194, 0.08542, 4.399e-06, 0.0, float("nan"), "paged")]
    ['15,273', '15,274', '17.19', '0.08542', '0.0000044', '0', '-', 'paged']
    """
    if isinstance(v, bool) or not isinstance(v, numbers.Real):
        return str(v)
    if isinstance(v, numbers.Integral):
        return f"{int(v):,}"
    v = float(v)
    if v != v:
        return "-"
    if v == 0 or abs(v) >= 1000:
        return f"{v:,.0f}"
    if abs(v) >= 1e-3:
        return f"{v:.4g}"
    return np.format_float_positional(v, precision=2, unique=False, fractional=False, trim="-")


def _percent(v) -> str:
    """A fraction as a percentage: 0.0915 -> '9.1%', 0.0000044 -> '<0.01%'.

    >>> [_percent(v) for v in (0.09148, 0.0004, 4.399e-06, 0.0, 1.0)]
    ['9.1%', '0.04%', '<0.01%', '0%', '100.0%']
    """
    if isinstance(v, bool) or not isinstance(v, numbers.Real) or v != v:
        return _fmt(v)
    p = 100 * float(v)
    if p == 0:
        return "0%"
    if abs(p) < 0.01:
        return "<0.01%"
    return f"{p:.1f}%" if abs(p) >= 1 else f"{p:.2f}%"


def _cells(df: pd.DataFrame, pct: frozenset) -> list[list[str]]:
    fmts = [_percent if c in pct else _fmt for c in df.columns]
    return [[f(v) for f, v in zip(fmts, row)] for row in df.itertuples(index=False)]


def _md_table(df: pd.DataFrame, pct: frozenset = frozenset()) -> str:
    head = "| " + " | ".join(str(c) for c in df.columns) + " |"
    rule = "|" + "|".join("---" for _ in df.columns) + "|"
    rows = ["| " + " | ".join(r) + " |" for r in _cells(df, pct)]
    return "\n".join([head, rule, *rows])


def _inline(text: str) -> str:
    s = html.escape(text)
    s = re.sub(r"`([^`]+)`", r"<code>\1</code>", s)
    return re.sub(r"\*\*([^*]+)\*\*", r"<b>\1</b>", s)


def _html_text(text: str) -> str:
    parts, items = [], []
    for line in text.splitlines():
        if line.startswith("- "):
            items.append(f"<li>{_inline(line[2:])}</li>")
            continue
        if items:
            parts.append("<ul>" + "".join(items) + "</ul>")
            items = []
        parts.append(_inline(line))
    if items:
        parts.append("<ul>" + "".join(items) + "</ul>")
    return "<p>" + " ".join(parts) + "</p>"


def png_bytes(fig: Figure, dpi: int = DPI) -> bytes:
    """The figure as PNG bytes (Agg canvas; works without pyplot or a display)."""
    buf = io.BytesIO()
    FigureCanvasAgg(fig)
    fig.savefig(buf, format="png", dpi=dpi, metadata={"Software": None})
    return buf.getvalue()


def check_out_dir(out: str | Path, force: bool = False) -> Path:
    """Refuse an existing `out` unless `force`: call before the simulations a report needs."""
    out = Path(out)
    if out.exists() and not force:
        raise ReportExistsError(f"{out}: folder exists; choose another or pass --force to replace it")
    if out.exists() and not out.is_dir():
        raise ReportExistsError(f"{out}: exists and is not a folder")
    return out


def write_report(report: Report, out: str | Path, force: bool = False, dpi: int = DPI,
                 command: str | None = None) -> Path:
    """Write `report.md`, `report.html`, `figures/*.png`, `data/*.csv` and `provenance.json` (kvsim
    version and commit, `command` — default: the running command line — and the engine-profile
    fingerprint, `kvsim.planning.reports.provenance`) into folder `out`, whole or not at all. Returns the folder."""
    from kvsim.planning.reports.provenance import PROVENANCE_FILE, describe, provenance
    out = check_out_dir(out, force)
    record = provenance(command)
    report = Report(report.title, [*report.blocks, ("h", "Provenance"), ("p", describe(record))])
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.parent / f".{out.name}.tmp{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        (tmp / "figures").mkdir(parents=True)
        (tmp / "data").mkdir()
        pngs = {}
        for block in report.blocks:
            if block[0] == "f":
                pngs[block[1]] = png_bytes(block[2], dpi)
                (tmp / "figures" / f"{block[1]}.png").write_bytes(pngs[block[1]])
            elif block[0] == "t":
                block[2].to_csv(tmp / "data" / f"{block[1]}.csv", index=False)
        (tmp / PROVENANCE_FILE).write_text(json.dumps(record, indent=2) + "\n")
        (tmp / "report.md").write_text(report.markdown())
        (tmp / "report.html").write_text(report.html(pngs))
        if out.exists():
            old = out.parent / f".{out.name}.old{os.getpid()}"
            out.rename(old)
            tmp.rename(out)
            shutil.rmtree(old)
        else:
            tmp.rename(out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out
