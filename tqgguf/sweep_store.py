"""A resumable store of sweep results: one JSON object per line, appended and synced as each run finishes.

Each record has a `key`, the hash of the fields that determine the result (for perplexity: model and text sha256,
context, chunks, cache config and build hash), the fields themselves, and the result. A sweep asks the store what is
done before running; a killed sweep loses only the run that was in flight (a half-written last line is ignored).
Later records with the same key replace earlier ones; every record stays in the file as history.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass, field
from pathlib import Path


def record_key(fields: dict) -> str:
    """A stable hash of the fields that determine a result (order-independent)."""
    return hashlib.sha256(json.dumps(fields, sort_keys=True, default=str).encode()).hexdigest()[:24]


@dataclass
class Store:
    path: Path
    skipped_lines: int = 0
    _records: list[dict] = field(default_factory=list)

    @classmethod
    def open(cls, path: Path) -> "Store":
        st = cls(Path(path))
        st.reload()
        return st

    def reload(self) -> None:
        self._records, self.skipped_lines = [], 0
        try:
            text = self.path.read_text(errors="replace")
        except FileNotFoundError:
            return
        for line in text.splitlines():
            line = line.strip()
            if not line:
                continue
            try:
                rec = json.loads(line)
            except ValueError:  # a line cut by a kill, or edited by hand
                self.skipped_lines += 1
                continue
            if isinstance(rec, dict) and "key" in rec:
                self._records.append(rec)

    @property
    def records(self) -> list[dict]:
        """Every record, oldest first."""
        return list(self._records)

    def latest(self) -> dict[str, dict]:
        """key -> the newest record with that key."""
        out: dict[str, dict] = {}
        for r in self._records:
            out[r["key"]] = r
        return out

    def get(self, key: str) -> dict | None:
        return self.latest().get(key)

    def append(self, fields: dict, result: dict, meta: dict | None = None) -> dict:
        """Add a finished result, durably (flushed and fsynced before returning)."""
        rec = {"key": record_key(fields), "fields": fields, "result": result, "meta": meta or {}}
        self.path.parent.mkdir(parents=True, exist_ok=True)
        line = json.dumps(rec, sort_keys=False, default=str)
        with open(self.path, "a+b") as f:
            f.seek(0, os.SEEK_END)
            if f.tell() > 0:  # a previous writer killed mid-line: start on a fresh line
                f.seek(-1, os.SEEK_END)
                if f.read(1) != b"\n":
                    f.write(b"\n")
            f.write(line.encode() + b"\n")
            f.flush()
            os.fsync(f.fileno())
        self._records.append(rec)
        return rec
