"""Atomic file writes: a temporary file in the target's directory, fsynced, then
``os.replace``; the target must be a regular file (or not exist yet) in an existing directory."""

from __future__ import annotations

import os
import stat
import tempfile
from pathlib import Path

from paraplan.specs.errors import SpecError


def check_target(path: str | Path, field: str = "--out") -> Path:
    """``path`` as a file paraplan may replace: not empty, its directory exists, and it is a
    regular file or absent (a symlink, FIFO, device or directory there is refused: replacing
    it would silently turn it into a regular file)."""
    text = str(path)
    if not text.strip():
        raise SpecError(f"{field} is empty; give a file path", field=field, value=text)
    target = Path(text)
    parent = target.parent
    if not parent.is_dir():
        why = "is not a directory" if parent.exists() else "does not exist (create it first)"
        raise SpecError(f"cannot write {field} {text!r}: {str(parent)!r} {why}", field=field,
                        value=text)
    try:
        info = os.lstat(target)
    except FileNotFoundError:
        return target
    except OSError as exc:
        raise SpecError(f"cannot write {field} {text!r}: {exc.strerror or exc}", field=field,
                        value=text) from None
    if not stat.S_ISREG(info.st_mode):
        kind = ("a symbolic link" if stat.S_ISLNK(info.st_mode) else "a directory"
                if stat.S_ISDIR(info.st_mode) else "not a regular file")
        raise SpecError(f"cannot write {field} {text!r}: it is {kind}; give the path of a "
                        "regular file", field=field, value=text)
    return target


def write_atomic(path: str | Path, text: str | bytes, *, field: str = "--out") -> Path:
    """Write ``text`` (UTF-8, or bytes) to ``path`` so readers see the old file or the new one,
    never a partial one. A replaced file keeps its mode; a new one gets 0666 minus the umask.

    Raises:
        SpecError: the target is not a regular file, its directory is missing, or it cannot be
            written (names ``field``).
    """
    target = check_target(path, field)
    try:
        mode = stat.S_IMODE(os.stat(target).st_mode)
    except FileNotFoundError:
        umask = os.umask(0)
        os.umask(umask)
        mode = 0o666 & ~umask
    try:
        fd, tmp = tempfile.mkstemp(prefix=".paraplan-", suffix=target.suffix,
                                   dir=target.parent)
    except OSError as exc:
        raise SpecError(f"cannot write {str(target)!r}: {exc.strerror or exc}", field=field,
                        value=str(target)) from None
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(text.encode("utf-8") if isinstance(text, str) else text)
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, target)
    except OSError as exc:
        raise SpecError(f"cannot write {str(target)!r}: {exc.strerror or exc}", field=field,
                        value=str(target)) from None
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return target
