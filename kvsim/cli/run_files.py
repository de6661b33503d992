"""The files of `kvsim run --out`: `steps.csv` streamed as the run goes (`StepsCsv`), then
`requests.csv`, `config.json` and last `summary.json`, each written whole (`write_outputs`)."""

from __future__ import annotations

import json
from pathlib import Path

from kvsim.files import atomic_write, result_folder, write_text_atomic


class StepsCsv:
    """A `simulate(step_sink=...)` that streams the step rows to `path` as they come (memory does not
    grow with the steps): written to a unique temporary name next to it (`.steps.csv.PID.RANDOM.tmp`,
    see kvsim.files.atomic_write), renamed by `commit()`. Write errors name `flag` and `path`."""

    def __init__(self, path: Path, flag: str = "--out"):
        self.path, self.flag, self.tmp = path, flag, None
        self._file = None

    def _open(self, header) -> None:
        import os
        import tempfile
        from kvsim.files import clean_stale_temps
        self.path.parent.mkdir(parents=True, exist_ok=True)
        clean_stale_temps(self.path)
        fd, tmp = tempfile.mkstemp(dir=self.path.parent, prefix=f".{self.path.name}.{os.getpid()}.",
                                   suffix=".tmp")
        self.tmp = Path(tmp)
        self._file = os.fdopen(fd, "w")
        self._file.write(",".join(header) + "\n")

    def __call__(self, columns: dict) -> None:
        """Append one chunk of rows (numpy columns in `kvsim.engine.metrics.STEP_COLUMNS` order)."""
        try:
            if self._file is None:
                self._open(columns)
            # repr for floats and str for ints: what pandas' to_csv writes
            text = [list(map(repr if col.dtype.kind == "f" else str, col.tolist())) for col in columns.values()]
            self._file.write("".join(",".join(row) + "\n" for row in zip(*text)))
        except OSError as exc:
            raise self._error(exc) from None

    def _error(self, exc: OSError) -> Exception:
        from kvsim.files import write_error
        return write_error(exc, self.path, self.flag)

    def commit(self) -> None:
        """Close the file and move it into place (a header only when there were no steps)."""
        try:
            if self._file is None:
                from kvsim.engine.metrics import STEP_COLUMNS
                self._open(STEP_COLUMNS)
            self._file.close()
            self.tmp.replace(self.path)
        except OSError as exc:
            raise self._error(exc) from None

    def discard(self) -> None:
        """Close and remove the temporary file (the run failed)."""
        if self._file is not None:
            from contextlib import suppress
            with suppress(OSError):
                self._file.close()
            self.tmp.unlink(missing_ok=True)


def write_outputs(out: Path, result, cfg, steps_csv: StepsCsv | None = None) -> None:
    """`steps.csv`, `requests.csv`, `config.json` and last `summary.json` into folder `out`, each file
    whole; the folder says INCOMPLETE until all are written (kvsim.files.result_folder). `steps_csv`:
    the steps were streamed there during the run (its temporary file goes if writing fails)."""
    try:
        with result_folder(out) as folder:
            if steps_csv is not None:
                steps_csv.commit()
            else:
                with atomic_write(folder / "steps.csv", newline="", flag="--out") as f:
                    result.steps.to_csv(f, index=False)
            with atomic_write(folder / "requests.csv", newline="", flag="--out") as f:
                result.requests.to_csv(f, index=False)
            write_text_atomic(folder / "config.json", json.dumps(cfg.to_dict(), indent=2, default=str), "--out")
            write_text_atomic(folder / "summary.json", json.dumps(result.summary, indent=2), "--out")
    except BaseException:
        if steps_csv is not None:
            steps_csv.discard()
        raise
