"""Atomic file writes: a temporary file in the target's directory, then ``os.replace``."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from paraplan.specs.errors import SpecError


def write_atomic(path: str | Path, text: str, *, field: str = "--out") -> Path:
    """Write ``text`` (UTF-8) to ``path`` so readers see the old file or the new one, never a
    partial one; the file gets the usual mode (0666 minus the umask).

    Raises:
        SpecError: the directory cannot be created or written (names ``field``).
    """
    target = Path(path)
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".paraplan-", suffix=target.suffix,
                                   dir=target.parent)
    except OSError as exc:
        raise SpecError(f"cannot write {str(target)!r}: {exc.strerror or exc}", field=field,
                        value=str(target)) from None
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)
        os.replace(tmp, target)
    except OSError as exc:
        raise SpecError(f"cannot write {str(target)!r}: {exc.strerror or exc}", field=field,
                        value=str(target)) from None
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return target
