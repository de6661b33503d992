"""The `kvsim` command line: the typer app (`app`), commands loaded on first use (`lazy`), the error
policy (`errors`: one line, exit 2), console tables and result folders (`output`), and one module per
command group. Imports anything in kvsim; nothing in kvsim imports it. Kept empty, but for one setting,
so that `kvsim --help` loads only what it needs.

That setting: one OpenBLAS thread (unless the user set `OPENBLAS_NUM_THREADS`), made before any command
imports numpy. numpy's OpenBLAS starts a thread per core on import, and kvsim's linear algebra (a few
small least-squares fits and dot products, `kvsim.cost`) is far below OpenBLAS's sizes for threading,
so the pool only costs CPU: `kvsim run` of the first 3,000 Azure conversation requests (`--engine-profile
vllm-2023 --gpu a100-80gb --quiet`), median of 7 alternating processes on a 2-core machine, 0.59 s of
CPU with the pool and 0.47 s without (wall 0.49 s and 0.47 s); in a sweep or `kvsim paper`, every
worker process would start its own pool. Child processes (workers) inherit it.
"""

import os

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
