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
        self.out = Path(out)
        if self.out.suffix.lower() not in (".parquet", ".csv"):
            raise SpecError(f"--out {str(out)!r} must end in .parquet or .csv", field="--out",
                            value=str(out))
        if not self.out.parent.is_dir():
            raise SpecError(f"--out {str(out)!r}: folder {str(self.out.parent)!r} does not "
                            "exist", field="--out", value=str(out))
        self.parts = self.out.with_name(self.out.name + ".parts")
        self.order = {job["job_id"]: i for i, job in enumerate(jobs)}
        manifest = json.dumps(sorted(self.order)).encode()
        if self.parts.exists():
            if not resume:
                raise SpecError(f"{str(self.parts)!r} holds an earlier sweep: add --resume to "
                                "finish it, or remove it", field="--resume", value=False)
            old = self.parts / MANIFEST
            if not old.is_file() or old.read_bytes() != manifest:
                raise SpecError(f"{str(self.parts)!r} belongs to another grid; --resume needs "
                                "the grid that started it", field="--grid",
                                value=str(self.parts))
        else:
            self.parts.mkdir()
            _write_atomic(self.parts / MANIFEST, manifest)

    def done(self) -> set[str]:
        """Job ids whose rows are already stored."""
        return {p.stem for p in self.parts.glob("*.json")
                if p.name != MANIFEST and p.stem in self.order}

    def add(self, job_id: str, rows: list[dict[str, Any]]) -> None:
        """Store one finished job's rows (atomically: all of them or none)."""
        _write_atomic(self.parts / f"{job_id}.json", json.dumps(rows).encode())

    def rows(self) -> list[dict[str, Any]]:
        """Every stored row, in grid order, then rank."""
        out = []
        for job_id in sorted(self.done(), key=self.order.__getitem__):
            out += json.loads((self.parts / f"{job_id}.json").read_text())
        return out

    def write_table(self, columns: tuple[str, ...],
                    int_columns: tuple[str, ...] = ()) -> list[Path]:
        """Write the table: ``out`` (.parquet needs pyarrow) and a CSV beside it. Returns the
        paths written."""
        import pandas as pd

        frame = pd.DataFrame(self.rows(), columns=list(columns))
        for col in int_columns:
            frame[col] = frame[col].astype("Int64")
        written = []
        csv_path = self.out.with_suffix(".csv")
        _write_atomic(csv_path, frame.to_csv(index=False).encode())
        written.append(csv_path)
        if self.out.suffix.lower() == ".parquet":
            try:
                import pyarrow  # noqa: F401
            except ImportError:
                raise SpecError("--out .parquet needs pyarrow: pip install 'paraplan[fleet]' "
                                f"(the CSV {str(csv_path)!r} is written)", field="--out",
                                value=str(self.out)) from None
            fd, tmp = tempfile.mkstemp(dir=self.out.parent, suffix=".parquet.tmp")
            os.close(fd)
            try:
                frame.to_parquet(tmp, index=False)
                os.replace(tmp, self.out)
            finally:
                if os.path.exists(tmp):
                    os.unlink(tmp)
            written.append(self.out)
        return written
