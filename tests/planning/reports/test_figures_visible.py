"""Every line a report draws is visible (issue 41), read from the plotted data: lines that coincide on
the timeline differ in style, and no block-size line sits on an axis border."""

import matplotlib

matplotlib.use("Agg")

import pandas as pd

from kvsim.planning.reports.figures import block_size_curve, timeline


def test_coinciding_timeline_lines_stay_apart_in_style():
    steps = pd.DataFrame({"time_s": [0.0, 1.0, 2.0], "running": [1, 2, 1], "token_states": [10, 20, 10],
                          "reserved": [0, 0, 0], "internal_fragmentation": [0, 0, 0]})
    fig = timeline({name: steps for name in ("a", "b", "c", "d")}, 100)
    for ax in fig.axes:
        lines = ax.get_lines()
        assert len(lines) == 4 and all(list(ln.get_ydata()) == list(lines[0].get_ydata()) for ln in lines)
        assert len({(ln.get_linestyle(), ln.get_linewidth()) for ln in lines}) == 4


def test_no_block_size_line_on_an_axis_border():
    df = pd.DataFrame({"block_size": [16, 32, 64], "waste_fraction": [0.0, 0.01, 0.3],
                       "mean_batch_size": [40.0, 40.0, 30.0], "throughput_tokens_per_s": [900.0, 905.0, 700.0],
                       "indirection_fraction": [0.003, 0.0, 0.0]})
    fig = block_size_curve(df, recommended=32)
    drawn = 0
    for ax in fig.axes:
        lo, hi = ax.get_ylim()
        for ln in ax.get_lines():
            y = [v for v in ln.get_ydata() if isinstance(v, (int, float))]
            if len(y) == len(df):                       # (the recommended size's vertical line aside)
                drawn += 1
                assert all(lo < v < hi for v in y), (ax.get_ylabel(), y, (lo, hi))
    assert drawn == 4
