"""`python -m gpu_harness check|calibrate ...`: the harness without the `kvsim` console script."""

from gpu_harness.cli import harness_app

harness_app(prog_name="python -m gpu_harness")
