"""`eagle3 generate`'s resumable output: sample i goes to `shard-NNNNN.jsonl` (i // S); while a
shard fills, finished records are appended to `shard-NNNNN.jsonl.partial` (one flushed line each),
so a run killed at any moment resumes from those lines, dropping at most a torn last line.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

REJECTED_FILE = "rejected.jsonl"
LONG_SAMPLES_FILE = "long-samples.jsonl"


def _read_jsonl_ids(path: Path) -> dict[str, str]:
    """id -> line for every complete line of an append-only file (a torn last line is dropped)."""
    lines: dict[str, str] = {}
    if not path.exists():
        return lines
    for line in path.read_text(encoding="utf-8").splitlines(keepends=True):
        if not line.endswith("\n"):
            break
        try:
            lines[json.loads(line)["id"]] = line
        except (json.JSONDecodeError, KeyError, TypeError):
            break
    return lines


class ShardedOutput:
    """Sample i goes to shard i // S; finished shards are sorted and renamed into place.

    A sample that yields no record (refused by the server, or too long to keep) is set aside
    in a list of its own (`rejected.jsonl`, `long-samples.jsonl`): it counts as done.
    """

    SET_ASIDE_FILES = (REJECTED_FILE, LONG_SAMPLES_FILE)

    def __init__(self, directory: Path, num_samples: int, samples_per_shard: int):
        self.directory, self.num_samples, self.per_shard = directory, num_samples, samples_per_shard
        self.num_shards = (num_samples + samples_per_shard - 1) // samples_per_shard
        self.pending: dict[int, dict[str, str]] = {}
        self.done_ids: set[str] = set()
        self.set_aside = {name: _read_jsonl_ids(directory / name) for name in self.SET_ASIDE_FILES}
        for shard in range(self.num_shards):
            final = self._final(shard)
            lines = _read_jsonl_ids(final if final.exists() else self._partial(shard))
            if not final.exists():
                # Rewrite the partial file without a torn tail before appending to it again.
                self._partial(shard).write_text("".join(lines.values()), encoding="utf-8")
                self.pending[shard] = lines
            self.done_ids.update(lines)
        for lines in self.set_aside.values():
            self.done_ids.update(lines)
        self._handles: dict[int, Any] = {}

    def _final(self, shard: int) -> Path:
        return self.directory / f"shard-{shard:05d}.jsonl"

    def _partial(self, shard: int) -> Path:
        return self.directory / f"shard-{shard:05d}.jsonl.partial"

    def _expected(self, shard: int) -> set[str]:
        end = min(self.num_samples, (shard + 1) * self.per_shard)
        return {sample_id(i) for i in range(shard * self.per_shard, end)}

    def add(self, index: int, line: str) -> None:
        shard = index // self.per_shard
        handle = self._handles.get(shard) or self._handles.setdefault(
            shard,
            open(self._partial(shard), "a", encoding="utf-8"),  # noqa: SIM115 - closed in _seal
        )
        handle.write(line)
        handle.flush()
        self.pending[shard][sample_id(index)] = line
        self.done_ids.add(sample_id(index))
        self.seal_complete()

    def put_aside(self, index: int, file_name: str, entry: dict) -> None:
        line = json.dumps({"id": sample_id(index), **entry}) + "\n"
        with open(self.directory / file_name, "a", encoding="utf-8") as handle:
            handle.write(line)
        self.set_aside[file_name][sample_id(index)] = line
        self.done_ids.add(sample_id(index))
        self.seal_complete()

    def seal_complete(self) -> None:
        aside = set().union(*self.set_aside.values())
        for shard in sorted(self.pending):
            if self._expected(shard) <= self.pending[shard].keys() | aside:
                self._seal(shard)

    def _seal(self, shard: int) -> None:
        handle = self._handles.pop(shard, None)
        if handle:
            handle.close()
        lines = self.pending.pop(shard)
        tmp = self.directory / f".shard-{shard:05d}.jsonl.tmp"
        tmp.write_text("".join(lines[k] for k in sorted(lines)), encoding="utf-8")
        tmp.rename(self._final(shard))
        self._partial(shard).unlink(missing_ok=True)

    def close(self) -> None:
        for handle in self._handles.values():
            handle.close()
        self._handles.clear()


def sample_id(index: int) -> str:
    return f"{index:08d}"


def shard_lines(directory: Path, shard: int) -> list[str]:
    return (directory / f"shard-{shard:05d}.jsonl").read_text(encoding="utf-8").splitlines()


def write_json_lines(path: Path, rows: list[dict]) -> None:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
