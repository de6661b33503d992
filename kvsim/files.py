"""Output files written whole or not at all, and output paths checked before any work is done.

Every file kvsim writes goes through `atomic_write` (or `write_text_atomic`): the content goes to a
temporary file in the target folder, which is renamed onto the target only when complete, so an
error or Ctrl-C leaves the old file or none, never a cut-off one. A result folder (`result_folder`)
holds an `INCOMPLETE` marker from before its first file is replaced until after its last one
(`summary.json`) is in place: a folder is a complete result exactly when it has `summary.json` and
no marker. `check_output_file` / `check_output_folder` refuse a path that cannot be written, naming
the flag, before a simulation spends minutes on a result it could not save.

Plain Python (no typer, no SimPy): the CLI, the planning tools and the GPU harness all use it.
"""

from __future__ import annotations

import json
import os
import tempfile
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import IO, Iterator

#: The file that marks a result folder as not (yet) complete.
INCOMPLETE_MARKER = "INCOMPLETE"
_MARKER_TEXT = ("kvsim has not finished writing this folder (it failed, was interrupted, or is still "
                "running); its files are not one complete result.\n")


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


_FILE_MODE = 0o666 & ~_umask()     # what open(path, "w") would give a new file


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:          # exists but is another user's
        return True
    return True


def clean_stale_temps(path: str | Path) -> None:
    """Remove the temporary files `atomic_write` left beside `path` in runs that were killed (SIGKILL
    skips every clean-up): `.NAME.PID.*.tmp` whose process PID is gone. Files of a live process (another
    kvsim writing the same file) and names of any other shape are left alone."""
    path = Path(path)
    with suppress(OSError):
        for tmp in path.parent.glob(f".{glob_escape(path.name)}.*.tmp"):
            pid = tmp.name[len(path.name) + 2:].split(".", 1)[0]
            if pid.isdigit() and int(pid) != os.getpid() and not _pid_alive(int(pid)):
                with suppress(OSError):
                    tmp.unlink()


def glob_escape(name: str) -> str:
    """`name` with glob's special characters taken literally."""
    return "".join(f"[{c}]" if c in "*?[" else c for c in name)


def write_error(exc: OSError, path: Path, flag: str | None) -> Exception:
    """The error to raise for `exc` while writing `path`: it names the final path (never the temporary
    one) and, given, the flag that chose it (`--json out.json: No space left on device`)."""
    reason = exc.strerror or str(exc)
    if flag is not None:
        return ValueError(f"{flag} {path}: cannot write: {reason}")
    return OSError(exc.errno, f"cannot write: {reason}", str(path))


@contextmanager
def atomic_write(path: str | Path, mode: str = "w", encoding: str | None = "utf-8",
                 newline: str | None = None, flag: str | None = None) -> Iterator[IO]:
    """Open a temporary file beside `path` for writing; when the block ends normally it replaces
    `path` in one rename, on any error (or KeyboardInterrupt) it is deleted and `path` is untouched.
    The temporary name is unique (`.NAME.PID.RANDOM.tmp`); ones left by killed runs are removed first.
    An OSError while writing (disk full, permission) names `path` and, given, `flag`."""
    path = Path(path)
    clean_stale_temps(path)
    try:
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.{os.getpid()}.", suffix=".tmp")
    except OSError as exc:
        raise write_error(exc, path, flag) from None
    try:
        try:
            with os.fdopen(fd, mode, encoding=None if "b" in mode else encoding,
                           newline=None if "b" in mode else newline) as f:
                yield f
            os.chmod(tmp, _FILE_MODE)
            os.replace(tmp, path)
        except OSError as exc:
            if exc.filename is not None and Path(exc.filename) != Path(tmp):
                raise                      # the caller's own error (e.g. reading an input file)
            raise write_error(exc, path, flag) from None
    except BaseException:
        with suppress(OSError):
            os.unlink(tmp)
        raise


def write_text_atomic(path: str | Path, text: str, flag: str | None = None) -> None:
    """`path.write_text(text)`, whole or not at all (errors name `flag` and `path`, see atomic_write)."""
    with atomic_write(path, flag=flag) as f:
        f.write(text)


def strict_json(value, default=None) -> str:
    """`value` as strict JSON text (RFC 8259, what `JSON.parse` accepts), indented 2: a NaN or infinite
    number becomes null and its dict gains `<key>_null_reason` saying which it was (in a list, the
    list's key gets the reason); `default` as json.dumps takes it."""
    return json.dumps(_finite(value), indent=2, default=default, allow_nan=False)


def _reason(x: float) -> str:
    return "NaN (not a number: undefined here)" if x != x else f"{'-' if x < 0 else ''}Infinity (unbounded)"


def _bad(x) -> bool:
    return isinstance(x, float) and not (x == x and abs(x) != float("inf"))


def _finite(value):
    if isinstance(value, dict):
        out = {}
        for key, v in value.items():
            out[key] = _finite(v)
            bad = v if _bad(v) else next((x for x in v if _bad(x)), None) if isinstance(v, (list, tuple)) else None
            if bad is not None:
                out[f"{key}_null_reason"] = _reason(bad)
        return out
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    if _bad(value):
        return None
    if hasattr(value, "item") and not isinstance(value, (str, bytes)):     # numpy scalars
        return _finite(value.item())
    return value


def write_json_atomic(path: str | Path, value, flag: str | None = None, default=None, end: str = "") -> None:
    """`value` written to `path` as strict JSON (`strict_json`, then `end`), whole or not at all."""
    write_text_atomic(path, strict_json(value, default) + end, flag)


def _probe(folder: Path, what: str) -> None:
    """Create and delete a temporary file in `folder` (the one sure test that it can be written)."""
    try:
        fd, tmp = tempfile.mkstemp(dir=folder, prefix=".kvsim-probe.", suffix=".tmp")
    except OSError as exc:
        raise ValueError(f"{what}: cannot write in {folder} ({exc.strerror or exc})") from None
    os.close(fd)
    os.unlink(tmp)


def check_output_file(path: str | Path, flag: str) -> None:
    """ValueError naming `flag` unless a file can be written at `path` (its folder exists and is
    writable, and `path` is not a folder)."""
    path = Path(path)
    what = f"{flag} {path}"
    if path.is_dir():
        raise ValueError(f"{what}: is a folder; give a file name")
    if not path.parent.is_dir():
        raise ValueError(f"{what}: folder {path.parent} does not exist")
    _probe(path.parent, what)


def check_output_folder(path: str | Path, flag: str) -> None:
    """ValueError naming `flag` unless `path` is a writable folder or can be created as one (its
    nearest existing ancestor is a writable folder); creates nothing."""
    path = Path(path)
    what = f"{flag} {path}"
    if path.exists() and not path.is_dir():
        raise ValueError(f"{what}: exists and is not a folder")
    ancestor = path
    while not ancestor.exists():
        ancestor = ancestor.parent
    if not ancestor.is_dir():
        raise ValueError(f"{what}: {ancestor} is a file, not a folder")
    _probe(ancestor, what)


def mark_incomplete(path: str | Path, last: str = "summary.json") -> Path:
    """Create folder `path` if needed, write its INCOMPLETE marker, then drop an older `last` file: from
    here on the folder says it is not one complete result (`result_folder` starts with it; a command that
    streamed files into the folder while it worked would have to call it before its first byte)."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    write_text_atomic(path / INCOMPLETE_MARKER, _MARKER_TEXT)
    (path / last).unlink(missing_ok=True)
    return path


@contextmanager
def result_folder(path: str | Path, last: str = "summary.json") -> Iterator[Path]:
    """Create folder `path` if needed and mark it INCOMPLETE (dropping an older `last` file) before the
    caller writes its files with `atomic_write`, `last` last; the marker goes only when the block ends
    normally, so a failure or Ctrl-C anywhere leaves a folder that says it is incomplete."""
    path = Path(path)
    if (path / INCOMPLETE_MARKER).is_file():      # marked already (by a command that streamed files)
        (path / last).unlink(missing_ok=True)
    else:
        mark_incomplete(path, last)
    yield path
    (path / INCOMPLETE_MARKER).unlink()


def is_complete_result(path: str | Path, last: str = "summary.json") -> bool:
    """Whether folder `path` holds a complete result: its `last` file and no INCOMPLETE marker."""
    path = Path(path)
    return (path / last).is_file() and not (path / INCOMPLETE_MARKER).exists()


def read_json_object(path: str | Path, what: str) -> dict:
    """The JSON object in file `path`; ValueError naming the file and `what` it should be when it cannot
    be read, is not JSON, or holds something other than an object."""
    path = Path(path)
    try:
        doc = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise ValueError(f"{path}: cannot read {what}: {exc}") from None
    if not isinstance(doc, dict):
        raise ValueError(f"{path}: a {what} must hold a JSON object")
    return doc
