"""Where a sweep keeps its results: one small JSON file per finished job, written atomically
next to the output (``<out>.parts/``), so a killed sweep loses nothing it finished and a
resumed one runs only what is missing; the table (CSV, and Parquet through pyarrow) is
assembled from those files."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

from paraplan.specs.errors import SpecError

MANIFEST = "grid.json"


def _write_atomic(path: Path, data: bytes) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


class ResultStore:
    """The parts folder of one sweep: ``open`` it for a grid, ``add`` each job's rows."""

    def __init__(self, out: str | Path, jobs: list[dict[str, Any]], *, resume: bool) -> None:
        from paraplan.export.files import check_target

        self.out = Path(out)
        if self.out.suffix.lower() not in (".parquet", ".csv"):
            raise SpecError(f"--out {str(out)!r} must end in .parquet or .csv", field="--out",
                            value=str(out))
        if self.out.suffix.lower() == ".parquet":
            try:
                import pyarrow  # noqa: F401
            except ImportError:
                raise SpecError("--out .parquet needs pyarrow: pip install 'paraplan[fleet]', "
                                "or write .csv", field="--out", value=str(out)) from None
        for target in (self.out, self.out.with_suffix(".csv")):
            check_target(target, "--out")  # a regular file (or none yet) in a real folder
        self.parts = self.out.with_name(self.out.name + ".parts")
        self.order = {job["job_id"]: i for i, job in enumerate(jobs)}
        manifest = json.dumps(sorted(self.order)).encode()
        if self.parts.is_symlink() or (self.parts.exists() and not self.parts.is_dir()):
            raise SpecError(f"{str(self.parts)!r} (where --out keeps finished jobs) is not a "
                            "folder; remove it", field="--out", value=str(out))
        old = self.parts / MANIFEST
        if self.parts.is_dir() and (old.exists() or any(self.parts.glob("*.json"))):
            if not resume:
                raise SpecError(f"{str(self.parts)!r} holds an earlier sweep: add --resume to "
                                "finish it, or remove it", field="--resume", value=False)
            if not old.is_file() or old.read_bytes() != manifest:
                raise SpecError(f"{str(self.parts)!r} belongs to another grid; --resume needs "
                                "the grid that started it", field="--grid",
                                value=str(self.parts))
        else:  # new, or created by a run killed before it stored anything
            self.parts.mkdir(exist_ok=True)
            _write_atomic(self.parts / MANIFEST, manifest)

    def done(self) -> set[str]:
        """Job ids whose rows are already stored."""
        return {p.stem for p in self.parts.glob("*.json")
                if p.name != MANIFEST and p.stem in self.order}

    def add(self, job_id: str, rows: list[dict[str, Any]]) -> None:
        """Store one finished job's rows (atomically: all of them or none)."""
        _write_atomic(self.parts / f"{job_id}.json", json.dumps(rows, allow_nan=False).encode())

    def rows(self) -> list[dict[str, Any]]:
        """Every stored row, in grid order, then rank."""
        out = []
        for job_id in sorted(self.done(), key=self.order.__getitem__):
            out += json.loads((self.parts / f"{job_id}.json").read_text())
        return out

    def table(self, columns: tuple[str, ...], int_columns: tuple[str, ...] = ()) -> Any:
        """Every stored row as a pandas DataFrame (``int_columns`` as nullable integers)."""
        import pandas as pd

        frame = pd.DataFrame(self.rows(), columns=list(columns))
        for col in int_columns:
            frame[col] = frame[col].astype("Int64")
        return frame

    def write_table(self, columns: tuple[str, ...],
                    int_columns: tuple[str, ...] = ()) -> list[Path]:
        """Write the table: ``out`` (.parquet needs pyarrow) and a CSV beside it. Returns the
        paths written."""
        return self.write_frame(self.table(columns, int_columns))

    def write_frame(self, frame: Any) -> list[Path]:
        """Write ``frame`` (:meth:`table`) as ``out`` and the CSV beside it; the paths."""
        import io

        from paraplan.export.files import write_atomic

        csv_path = self.out.with_suffix(".csv")
        written = [write_atomic(csv_path, frame.to_csv(index=False), field="--out")]
        if self.out.suffix.lower() == ".parquet":
            buf = io.BytesIO()
            frame.to_parquet(buf, index=False)
            written.append(write_atomic(self.out, buf.getvalue(), field="--out"))
        return written
