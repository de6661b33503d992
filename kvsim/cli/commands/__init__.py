"""The sub-commands other than `run` and `compare`: capacity, sweep, report, tune-block-size,
paper, hybrid-study, calibrate-engine, trace, and the fleet / P/D options of run and report.

May import everything below the CLI and the shared CLI machinery (`kvsim.cli.errors`, `output`, `options`).
"""
