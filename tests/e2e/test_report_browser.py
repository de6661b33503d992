"""The HTML reports in a real browser: Debian's headless Chromium renders each shipped `report.html` (and a
fresh one with a table wider than the page) at 1,280 px, and the screenshot shows content — not a blank
page — that stays inside the page's text column: nothing runs into the right-hand margin.

Without Chromium (`apt-get install chromium-headless-shell`, or chromium) the tests skip and say so.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from kvsim.planning.reports.document import Report, write_report
from tests.e2e.test_report_freshness import KNOWN_STALE

ROOT = Path(__file__).resolve().parents[2]
BROWSER = next((shutil.which(b) for b in ("chromium-headless-shell", "chromium", "chromium-browser")
                if shutil.which(b)), None)
pytestmark = pytest.mark.skipif(BROWSER is None, reason="no headless Chromium (apt-get install "
                                                        "chromium-headless-shell) to render the HTML reports")
WIDTH, HEIGHT = 1280, 2000


def screenshot(html: Path, png: Path) -> np.ndarray:
    """The page as an RGB array (HEIGHT x WIDTH x 3, 0-255)."""
    from PIL import Image
    subprocess.run([BROWSER, "--no-sandbox", "--disable-gpu", "--hide-scrollbars", f"--screenshot={png}",
                    f"--window-size={WIDTH},{HEIGHT}", html.resolve().as_uri()],
                   check=True, capture_output=True, timeout=120)
    return np.asarray(Image.open(png).convert("RGB"))


def check_page(pixels: np.ndarray) -> None:
    ink = (pixels < 200).any(axis=2)                 # darker than a light grey: text, lines, bars
    assert pixels.shape[:2] == (HEIGHT, WIDTH)
    assert ink.mean() > 0.002, "the page renders blank"
    # the text column is at most 60em (~960 px at 16 px) centred: the outer 100 px on the right are margin
    assert not ink[:, -100:].any(), "something runs off the text column into the right margin"


def test_a_table_wider_than_the_page_scrolls_inside_its_column(tmp_path):
    """The tuner's full curve has 14 columns; 30 of them would run ~2,500 px wide."""
    rep = Report("Wide")
    rep.paragraph("A table with thirty columns of large numbers.")
    rep.table("wide", pd.DataFrame({f"column number {i}": [123456.789 * i] for i in range(30)}))
    out = write_report(rep, tmp_path / "r")
    check_page(screenshot(out / "report.html", tmp_path / "shot.png"))


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(p.name for p in (ROOT / "reports").iterdir() if p.is_dir()))
def test_shipped_report_renders_in_a_browser(name, tmp_path):
    if name in KNOWN_STALE:
        pytest.skip(f"known stale, rendered after its regeneration: {KNOWN_STALE[name]}")
    check_page(screenshot(ROOT / "reports" / name / "report.html", tmp_path / "shot.png"))
