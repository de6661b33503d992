"""The files of `kvsim run --out`: `steps.csv` streamed as the run goes (`StepsCsv`), then
`requests.csv`, `config.json` and last `summary.json`, each written whole (`write_outputs`).

A fleet (`--replicas N`, N > 1) writes, through the same policy, each replica's steps and summary in
`replicas/<r>/` (`ReplicaSteps` streams the steps), every request with its replica in `requests.csv`,
the router's decision per request in `routing.csv`, the engine's configuration with the fleet's in
`config.json`, and the fleet's summary (each replica's inside) last (`write_fleet_outputs`). A
disaggregated run writes `requests.csv`, `config.json` and `summary.json` (`write_disagg_outputs`).
Files another kind of run left in the folder (a plain run's `steps.csv`, a fleet's `routing.csv` and
`replicas/`) are removed, so the folder holds one result."""

from __future__ import annotations

from pathlib import Path

from kvsim.files import atomic_write, result_folder, strict_json, write_text_atomic


class StepsCsv:
    """A `simulate(step_sink=...)` that streams the step rows to `path` as they come (memory does not
    grow with the steps): written to a unique temporary name (`.NAME.PID.RANDOM.tmp`, see
    kvsim.files.atomic_write), renamed onto `path` by `commit()`. Given the result `folder` that holds
    `path`, the temporary file lies beside that folder (in its nearest existing ancestor, named after the
    folder and the path inside it), so nothing of a running simulation enters the folder: a kill at any
    moment leaves an older result there untouched, and a Ctrl-C before the end creates no folder. Write
    errors name `flag` and `path`."""

    def __init__(self, path: Path, flag: str = "--out", folder: Path | None = None):
        self.path, self.flag, self.folder, self.tmp = path, flag, folder, None
        self._file = None

    def _place(self) -> tuple[Path, str]:
        """(folder of the temporary file, its name stem)."""
        if self.folder is None:
            return self.path.parent, self.path.name
        folder = Path(self.folder).absolute()
        anchor = folder.parent
        while not anchor.is_dir() and anchor != anchor.parent:
            anchor = anchor.parent
        return anchor, ".".join(self.path.absolute().relative_to(anchor).parts)

    def _open(self, header) -> None:
        import os
        import tempfile
        from kvsim.files import clean_stale_temps
        where, stem = self._place()
        where.mkdir(parents=True, exist_ok=True)
        clean_stale_temps(where / stem)
        fd, tmp = tempfile.mkstemp(dir=where, prefix=f".{stem}.{os.getpid()}.", suffix=".tmp")
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
        import os
        try:
            if self._file is None:
                from kvsim.engine.metrics import STEP_COLUMNS
                self._open(STEP_COLUMNS)
            self._file.close()
            from kvsim.files import _FILE_MODE
            os.chmod(self.tmp, _FILE_MODE)     # mkstemp's 0600 -> what open(path, "w") gives
            self.path.parent.mkdir(parents=True, exist_ok=True)
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


class ReplicaSteps:
    """A fleet's `replicas/<r>/steps.csv`, one `StepsCsv` per replica (`sinks`: what
    `simulate_fleet(step_sinks=...)` takes)."""

    def __init__(self, out: Path, replicas: int):
        self.sinks = [StepsCsv(out / "replicas" / str(r) / "steps.csv", folder=out) for r in range(replicas)]

    def commit(self) -> None:
        for sink in self.sinks:
            sink.commit()

    def discard(self) -> None:
        for sink in self.sinks:
            sink.discard()


def write_outputs(out: Path, result, cfg, steps_csv: StepsCsv | ReplicaSteps | None = None, fleet=None) -> None:
    """`steps.csv`, `requests.csv`, `config.json` and last `summary.json` into folder `out`, each file
    whole; the folder says INCOMPLETE until all are written (kvsim.files.result_folder). `steps_csv`:
    the steps were streamed there during the run (its temporary file goes if writing fails). A fleet's
    result (`fleet`: its `FleetConfig`, more than one replica) goes to `write_fleet_outputs`."""
    if fleet is not None and fleet.replicas > 1:
        return write_fleet_outputs(out, result, cfg, fleet, steps_csv)
    try:
        with result_folder(out) as folder:
            _drop_stale(folder, steps=False)
            if steps_csv is not None:
                steps_csv.commit()
            else:
                with atomic_write(folder / "steps.csv", newline="", flag="--out") as f:
                    result.steps.to_csv(f, index=False)
            with atomic_write(folder / "requests.csv", newline="", flag="--out") as f:
                result.requests.to_csv(f, index=False)
            write_text_atomic(folder / "config.json", strict_json(cfg.to_dict(), default=str), "--out")
            write_text_atomic(folder / "summary.json", strict_json(result.summary), "--out")
    except BaseException:
        if steps_csv is not None:
            steps_csv.discard()
        raise


def write_fleet_outputs(out: Path, result, cfg, fleet, steps: ReplicaSteps | None = None) -> None:
    """A fleet's folder (module docstring), each file whole, `summary.json` last; `steps`: the
    replicas' steps streamed during the run (their temporary files go if writing fails)."""
    import pandas as pd
    from dataclasses import asdict

    try:
        with result_folder(out) as folder:
            _drop_stale(folder, steps=True, replicas=fleet.replicas)
            if steps is not None:
                steps.commit()
            for r, summary in enumerate(result.summary["fleet"]["per_replica"]):
                (folder / "replicas" / str(r)).mkdir(parents=True, exist_ok=True)
                write_text_atomic(folder / "replicas" / str(r) / "summary.json", strict_json(summary), "--out")
            with atomic_write(folder / "requests.csv", newline="", flag="--out") as f:
                result.requests.to_csv(f, index=False)
            with atomic_write(folder / "routing.csv", newline="", flag="--out") as f:
                pd.DataFrame(result.routing).to_csv(f, index=False)
            config = {**cfg.to_dict(), "fleet": asdict(fleet)}
            write_text_atomic(folder / "config.json", strict_json(config, default=str), "--out")
            write_text_atomic(folder / "summary.json", strict_json(result.summary), "--out")
    except BaseException:
        if steps is not None:
            steps.discard()
        raise


def write_disagg_outputs(out: Path, requests, config: dict, summary: dict) -> None:
    """A disaggregated run's folder: `requests.csv` (a pandas table), `config.json` (both sides) and
    `summary.json` last, each whole."""
    with result_folder(out) as folder:
        _drop_stale(folder, steps=True)
        with atomic_write(folder / "requests.csv", newline="", flag="--out") as f:
            requests.to_csv(f, index=False)
        write_text_atomic(folder / "config.json", strict_json(config, default=str), "--out")
        write_text_atomic(folder / "summary.json", strict_json(summary), "--out")


def _drop_stale(folder: Path, steps: bool, replicas: int = 0) -> None:
    """Remove what another kind of run wrote in `folder`: `steps.csv` (`steps`: this run writes none
    at the top), a fleet's `routing.csv` (unless `replicas`) and `replicas/<r>/` of replicas >= `replicas`
    (only kvsim's file names; a folder left empty goes too)."""
    import contextlib

    stale = [folder / "steps.csv"] if steps else []
    if not replicas:
        stale.append(folder / "routing.csv")
    base = folder / "replicas"
    old = [p for p in base.iterdir() if p.name.isdigit() and int(p.name) >= replicas] if base.is_dir() else []
    for path in [*stale, *(p / name for p in old for name in ("steps.csv", "summary.json"))]:
        try:
            path.unlink(missing_ok=True)
        except OSError as exc:
            from kvsim.files import write_error
            raise write_error(exc, path, "--out") from None
    for path in [*old, base]:
        with contextlib.suppress(OSError):
            path.rmdir()                 # (only when empty)
