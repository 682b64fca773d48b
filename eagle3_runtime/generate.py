"""`eagle3 generate`: regenerate training conversations on-policy from a running vLLM target.

Prompts come from one or more sources (JSONL, Parquet, or a dataset directory of such files,
plus Arrow files as `datasets.save_to_disk` writes them), each with a mode (`chat` through
`/v1/chat/completions`, which applies the server's chat template, or `completion` through raw
`/v1/completions`), a weight and a field mapping. A fixed, seeded plan assigns every sample
index to a source row, so a restarted run asks for exactly the samples still missing.

Output (docs/contracts.md, `data/`): `shard-NNNNN.jsonl` files of `ConversationRecord`s, each
holding the samples `[N*S, (N+1)*S)` in order, and `manifest.json` once all are done. While a
shard fills, finished records are appended to `shard-NNNNN.jsonl.partial` (one flushed line
each); a run killed at any moment resumes from those lines, dropping at most a torn last line,
so nothing is lost or duplicated.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import random
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import httpx

from eagle3_runtime.conversations import FORMAT, MANIFEST, ConversationRecord, Mode
from eagle3_runtime.layout import write_json_atomic
from eagle3_runtime.progress import ProgressReporter

log = logging.getLogger(__name__)
# One INFO line per request would drown the progress bar and the retry messages.
logging.getLogger("httpx").setLevel(logging.WARNING)

PLAN_FILE = "plan.json"
BAD_ROWS_FILE = "bad-rows.jsonl"
REJECTED_FILE = "rejected.jsonl"
DATA_SUFFIXES = (".jsonl", ".json", ".parquet", ".arrow")
RETRYABLE_STATUS = {408, 409, 425, 429, 500, 502, 503, 504}


# ---------------------------------------------------------------- sources


@dataclass(frozen=True)
class SourceSpec:
    """One `--source PATH[,mode=...][,weight=...][,prompt-field=...][,messages-field=...]` argument."""

    path: str
    mode: Mode = "chat"
    weight: float = 1.0
    prompt_field: str = "prompt"
    messages_field: str = "messages"
    domain: str | None = None  # fixed domain label; default: the field `domain_field`, else the file name
    domain_field: str = "domain"

    @classmethod
    def parse(cls, text: str) -> SourceSpec:
        path, *options = text.split(",")
        if not path:
            raise ValueError(f"--source {text!r}: no path")
        known = {"mode", "weight", "prompt-field", "messages-field", "domain", "domain-field"}
        values: dict[str, Any] = {}
        for option in options:
            key, sep, value = option.partition("=")
            if not sep or key not in known:
                raise ValueError(
                    f"--source {text!r}: unknown option {option!r} (known: {', '.join(sorted(known))})"
                )
            values[key.replace("-", "_")] = value
        if values.get("mode", "chat") not in ("chat", "completion"):
            raise ValueError(f"--source {text!r}: mode must be chat or completion")
        if "weight" in values:
            try:
                values["weight"] = float(values["weight"])
            except ValueError:
                raise ValueError(f"--source {text!r}: weight must be a number") from None
            if values["weight"] <= 0:
                raise ValueError(f"--source {text!r}: weight must be positive")
        return cls(path=path, **values)


@dataclass
class Prompt:
    source: int
    domain: str
    location: str  # "file:line" (or "file:row N"), for messages about this row
    messages: list[dict[str, str]] | None = None  # chat mode
    text: str | None = None  # completion mode


@dataclass
class BadRow:
    location: str
    reason: str


def _source_files(path: Path) -> list[Path]:
    if path.is_file():
        return [path]
    if path.is_dir():
        files = sorted(p for p in path.rglob("*") if p.is_file() and p.suffix in DATA_SUFFIXES)
        if not files:
            raise FileNotFoundError(f"{path}: no {'/'.join(DATA_SUFFIXES)} files in this dataset directory")
        return files
    raise FileNotFoundError(f"source {path} does not exist")


def _raw_rows(file: Path) -> Iterator[tuple[str, dict | None, str]]:
    """(location, row or None, why it is unreadable) for every row of one file."""
    if file.suffix in (".jsonl", ".json"):
        with open(file, encoding="utf-8") as handle:
            for number, line in enumerate(handle, 1):
                if not line.strip():
                    continue
                try:
                    row = json.loads(line)
                except json.JSONDecodeError as exc:
                    yield f"{file}:{number}", None, f"invalid JSON ({exc.msg} at column {exc.colno})"
                    continue
                if not isinstance(row, dict):
                    yield f"{file}:{number}", None, f"expected a JSON object, got {type(row).__name__}"
                    continue
                yield f"{file}:{number}", row, ""
        return
    import pyarrow as pa
    import pyarrow.parquet as pq

    if file.suffix == ".parquet":
        table = pq.read_table(file)
    else:
        with pa.memory_map(str(file)) as stream:
            try:
                table = pa.ipc.open_stream(stream).read_all()
            except pa.ArrowInvalid:
                table = pa.ipc.open_file(stream).read_all()
    for number, row in enumerate(table.to_pylist(), 1):
        yield f"{file}:row {number}", row, ""


def _normalise_messages(value: Any) -> list[dict[str, str]]:
    """OpenAI-style [{"role", "content"}] or ShareGPT-style [{"from", "value"}] -> OpenAI style."""
    sharegpt_roles = {
        "human": "user",
        "user": "user",
        "gpt": "assistant",
        "assistant": "assistant",
        "system": "system",
    }
    if not isinstance(value, list) or not value:
        raise ValueError("messages must be a non-empty list")
    messages = []
    for turn in value:
        if not isinstance(turn, dict):
            raise ValueError("each message must be an object")
        if "role" in turn and isinstance(turn.get("content"), str):
            messages.append({"role": str(turn["role"]), "content": turn["content"]})
        elif turn.get("from") in sharegpt_roles and isinstance(turn.get("value"), str):
            messages.append({"role": sharegpt_roles[turn["from"]], "content": turn["value"]})
        else:
            raise ValueError("each message needs role+content (or ShareGPT from+value) strings")
    # Regenerate the last assistant reply: the prompt ends with the last user turn.
    while messages and messages[-1]["role"] == "assistant":
        messages.pop()
    if not messages or messages[-1]["role"] != "user":
        raise ValueError("the conversation has no user turn to answer")
    return messages


def _prompt_from_row(spec: SourceSpec, index: int, location: str, row: dict, file: Path) -> Prompt:
    domain = spec.domain or str(row.get(spec.domain_field) or file.stem)
    if spec.mode == "completion":
        text = row.get(spec.prompt_field)
        if not isinstance(text, str) or not text:
            raise ValueError(f"field {spec.prompt_field!r} is missing or not a non-empty string")
        return Prompt(index, domain, location, text=text)
    if spec.messages_field in row:
        messages = _normalise_messages(row[spec.messages_field])
    elif isinstance(row.get(spec.prompt_field), str) and row[spec.prompt_field]:
        messages = [{"role": "user", "content": row[spec.prompt_field]}]
    else:
        raise ValueError(f"neither field {spec.messages_field!r} nor {spec.prompt_field!r} holds a prompt")
    return Prompt(index, domain, location, messages=messages)


def load_prompts(specs: list[SourceSpec], on_bad_row: str) -> tuple[list[list[Prompt]], list[BadRow]]:
    """Every usable prompt per source; bad rows are refused (`fail`) or listed and skipped (`skip`)."""
    per_source, bad = [], []
    for index, spec in enumerate(specs):
        prompts = []
        for file in _source_files(Path(spec.path)):
            for location, row, reason in _raw_rows(file):
                if row is not None:
                    try:
                        prompts.append(_prompt_from_row(spec, index, location, row, file))
                        continue
                    except ValueError as exc:
                        reason = str(exc)
                if on_bad_row == "fail":
                    raise ValueError(f"{location}: {reason} (use --on-bad-row skip to skip such rows)")
                log.warning("skipping bad input row %s: %s", location, reason)
                bad.append(BadRow(location, reason))
        if not prompts:
            raise ValueError(f"source {spec.path} has no usable rows")
        per_source.append(prompts)
    return per_source, bad


def sample_plan(
    per_source: list[list[Prompt]], weights: list[float], num_samples: int, seed: int
) -> list[Prompt]:
    """Sample i -> prompt: a seeded weighted choice of source, then that source's rows in a
    seeded order (cycling when a source runs out)."""
    rng = random.Random(seed)
    orders = []
    for prompts in per_source:
        order = list(range(len(prompts)))
        rng.shuffle(order)
        orders.append(order)
    taken = [0] * len(per_source)
    plan = []
    for _ in range(num_samples):
        source = rng.choices(range(len(per_source)), weights=weights)[0]
        prompts, order = per_source[source], orders[source]
        plan.append(prompts[order[taken[source] % len(order)]])
        taken[source] += 1
    return plan


# ---------------------------------------------------------------- requests


@dataclass(frozen=True)
class SamplingSettings:
    model: str
    max_tokens: int = 512
    temperature: float = 0.0
    top_p: float = 1.0
    seed: int = 0


@dataclass(frozen=True)
class RetryPolicy:
    max_attempts: int = 8
    base_delay_s: float = 0.5
    max_delay_s: float = 30.0
    request_timeout_s: float = 600.0


class RejectedRequest(Exception):
    """The server refused the request for good (a 4xx other than 429): retrying cannot help."""


async def _post_with_retries(client: httpx.AsyncClient, path: str, body: dict, policy: RetryPolicy) -> dict:
    for attempt in range(1, policy.max_attempts + 1):
        try:
            response = await client.post(path, json=body, timeout=policy.request_timeout_s)
        except (httpx.TimeoutException, httpx.TransportError) as exc:
            problem, retry_after = f"{type(exc).__name__}: {exc}", None
        else:
            if response.status_code == 200:
                return response.json()
            if response.status_code not in RETRYABLE_STATUS:
                raise RejectedRequest(f"HTTP {response.status_code}: {response.text[:300]}")
            problem, retry_after = f"HTTP {response.status_code}", response.headers.get("retry-after")
        if attempt == policy.max_attempts:
            raise RuntimeError(f"{path} failed {attempt} times; last: {problem}")
        delay = min(policy.max_delay_s, policy.base_delay_s * 2 ** (attempt - 1)) * random.uniform(0.5, 1.0)
        if retry_after and retry_after.replace(".", "", 1).isdigit():
            delay = min(policy.max_delay_s, max(delay, float(retry_after)))
        log.info("%s: %s; retry %d/%d in %.1f s", path, problem, attempt, policy.max_attempts - 1, delay)
        await asyncio.sleep(delay)
    raise AssertionError("unreachable")


async def generate_one(
    client: httpx.AsyncClient, sample_id: str, prompt: Prompt, sampling: SamplingSettings, policy: RetryPolicy
) -> ConversationRecord:
    common = {
        "model": sampling.model,
        "max_tokens": sampling.max_tokens,
        "temperature": sampling.temperature,
        "top_p": sampling.top_p,
        # Per-sample seed: a regenerated sample is the same sample, whatever the run order.
        "seed": sampling.seed * 1_000_003 + int(sample_id),
        "return_token_ids": True,
    }
    meta = {"source": prompt.location}
    if prompt.messages is not None:
        reply = await _post_with_retries(
            client, "/v1/chat/completions", {**common, "messages": prompt.messages}, policy
        )
        choice = reply["choices"][0]
        content = choice["message"].get("content") or ""
        return ConversationRecord(
            id=sample_id,
            mode="chat",
            domain=prompt.domain,
            messages=[*prompt.messages, {"role": "assistant", "content": content}],
            prompt_token_ids=reply.get("prompt_token_ids"),
            completion_token_ids=choice.get("token_ids"),
            finish_reason=choice.get("finish_reason"),
            meta=meta,
        )
    reply = await _post_with_retries(client, "/v1/completions", {**common, "prompt": prompt.text}, policy)
    choice = reply["choices"][0]
    return ConversationRecord(
        id=sample_id,
        mode="completion",
        domain=prompt.domain,
        prompt=prompt.text,
        completion=choice.get("text") or "",
        prompt_token_ids=choice.get("prompt_token_ids"),
        completion_token_ids=choice.get("token_ids"),
        finish_reason=choice.get("finish_reason"),
        meta=meta,
    )


# ---------------------------------------------------------------- resumable output


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
    """Sample i goes to shard i // S; finished shards are sorted and renamed into place."""

    def __init__(self, directory: Path, num_samples: int, samples_per_shard: int):
        self.directory, self.num_samples, self.per_shard = directory, num_samples, samples_per_shard
        self.num_shards = (num_samples + samples_per_shard - 1) // samples_per_shard
        self.pending: dict[int, dict[str, str]] = {}
        self.done_ids: set[str] = set()
        self.rejected = _read_jsonl_ids(directory / REJECTED_FILE)
        for shard in range(self.num_shards):
            final = self._final(shard)
            lines = _read_jsonl_ids(final if final.exists() else self._partial(shard))
            if not final.exists():
                # Rewrite the partial file without a torn tail before appending to it again.
                self._partial(shard).write_text("".join(lines.values()), encoding="utf-8")
                self.pending[shard] = lines
            self.done_ids.update(lines)
        self.done_ids.update(self.rejected)
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

    def reject(self, index: int, reason: str) -> None:
        line = json.dumps({"id": sample_id(index), "reason": reason}) + "\n"
        with open(self.directory / REJECTED_FILE, "a", encoding="utf-8") as handle:
            handle.write(line)
        self.rejected[sample_id(index)] = line
        self.done_ids.add(sample_id(index))
        self.seal_complete()

    def seal_complete(self) -> None:
        for shard in sorted(self.pending):
            if self._expected(shard) <= self.pending[shard].keys() | self.rejected.keys():
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


# ---------------------------------------------------------------- the stage


@dataclass
class GenerateConfig:
    server: str
    sources: list[SourceSpec]
    sampling: SamplingSettings
    num_samples: int
    concurrency: int = 8
    on_bad_row: str = "skip"
    samples_per_shard: int = 256
    retry: RetryPolicy = field(default_factory=RetryPolicy)


@dataclass
class GenerateSummary:
    samples: int
    tokens: int
    tokens_per_second: float
    bad_rows: int
    rejected: int
    resumed: int
    seconds: float


def _plan_fingerprint(config: GenerateConfig) -> dict:
    """What the sample plan depends on; a resumed run must match it."""
    sources = []
    for spec in config.sources:
        files = _source_files(Path(spec.path))
        digest = hashlib.sha256()
        for file in files:
            digest.update(f"{file.name}:{file.stat().st_size}:{file.stat().st_mtime_ns}".encode())
        sources.append({**asdict(spec), "files": digest.hexdigest()[:16]})
    return {
        "sources": sources,
        "num_samples": config.num_samples,
        "samples_per_shard": config.samples_per_shard,
        "sampling": asdict(config.sampling),
    }


def _check_plan(directory: Path, fingerprint: dict) -> None:
    path = directory / PLAN_FILE
    if path.exists():
        previous = json.loads(path.read_text())
        if previous != fingerprint:
            raise ValueError(
                f"{directory} holds a generation run with other settings or inputs; "
                "use the same arguments to resume it, or remove the directory to start over"
            )
    else:
        write_json_atomic(path, fingerprint)


def _summary_from_manifest(manifest: dict) -> GenerateSummary:
    return GenerateSummary(**{k: manifest[k] for k in GenerateSummary.__dataclass_fields__})


def run_generate(
    config: GenerateConfig, output_dir: Path, reporter: ProgressReporter | None = None
) -> GenerateSummary:
    if config.num_samples < 1:
        raise ValueError("--num-samples must be at least 1")
    if config.concurrency < 1:
        raise ValueError("--concurrency must be at least 1")
    if not config.sources:
        raise ValueError("give at least one --source")
    output_dir.mkdir(parents=True, exist_ok=True)
    if (output_dir / MANIFEST).exists():
        manifest = json.loads((output_dir / MANIFEST).read_text())
        log.info("%s is complete (%d samples); nothing to do", output_dir, manifest["samples"])
        return _summary_from_manifest(manifest)
    _check_plan(output_dir, _plan_fingerprint(config))

    per_source, bad_rows = load_prompts(config.sources, config.on_bad_row)
    write_json_lines(output_dir / BAD_ROWS_FILE, [asdict(b) for b in bad_rows])
    plan = sample_plan(
        per_source, [s.weight for s in config.sources], config.num_samples, config.sampling.seed
    )
    output = ShardedOutput(output_dir, config.num_samples, config.samples_per_shard)
    resumed = len(output.done_ids)
    todo = [i for i in range(config.num_samples) if sample_id(i) not in output.done_ids]
    if resumed:
        log.info("resuming: %d of %d samples already done", resumed, config.num_samples)

    started = time.monotonic()
    try:
        tokens = asyncio.run(_generate_all(config, plan, todo, output, reporter))
    finally:
        output.close()
    seconds = time.monotonic() - started

    records = [
        ConversationRecord.from_json(line)
        for shard in range(output.num_shards)
        for line in _shard_lines(output_dir, shard)
    ]
    total_tokens = sum(r.num_generated_tokens for r in records)
    summary = GenerateSummary(
        samples=len(records),
        tokens=total_tokens,
        tokens_per_second=round(tokens / seconds, 2) if seconds > 0 else 0.0,
        bad_rows=len(bad_rows),
        rejected=len(output.rejected),
        resumed=resumed,
        seconds=round(seconds, 2),
    )
    shards = [
        {"file": f"shard-{s:05d}.jsonl", "num_samples": len(_shard_lines(output_dir, s))}
        for s in range(output.num_shards)
    ]
    domains: dict[str, int] = {}
    for record in records:
        domains[record.domain] = domains.get(record.domain, 0) + 1
    write_json_atomic(
        output_dir / MANIFEST, {"format": FORMAT, "shards": shards, "domains": domains, **asdict(summary)}
    )
    return summary


def _shard_lines(directory: Path, shard: int) -> list[str]:
    return (directory / f"shard-{shard:05d}.jsonl").read_text(encoding="utf-8").splitlines()


def write_json_lines(path: Path, rows: list[dict]) -> None:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")


async def _generate_all(
    config: GenerateConfig,
    plan: list[Prompt],
    todo: list[int],
    output: ShardedOutput,
    reporter: ProgressReporter | None,
) -> int:
    """Run the missing samples with at most `concurrency` requests in flight; returns tokens generated."""
    from tqdm import tqdm

    queue: asyncio.Queue[int] = asyncio.Queue()
    for index in todo:
        queue.put_nowait(index)
    started = time.monotonic()
    state = {"tokens": 0, "done": 0}
    bar = tqdm(
        total=config.num_samples, initial=config.num_samples - len(todo), desc="generate", unit="sample"
    )
    limits = httpx.Limits(max_connections=config.concurrency, max_keepalive_connections=config.concurrency)

    async with httpx.AsyncClient(base_url=config.server.rstrip("/"), limits=limits) as client:

        async def worker() -> None:
            while True:
                try:
                    index = queue.get_nowait()
                except asyncio.QueueEmpty:
                    return
                try:
                    record = await generate_one(
                        client, sample_id(index), plan[index], config.sampling, config.retry
                    )
                except RejectedRequest as exc:
                    log.warning(
                        "sample %s (%s) refused by the server: %s",
                        sample_id(index),
                        plan[index].location,
                        exc,
                    )
                    output.reject(index, str(exc))
                else:
                    output.add(index, record.to_json() + "\n")
                    state["tokens"] += record.num_generated_tokens
                state["done"] += 1
                elapsed = time.monotonic() - started
                rate = state["tokens"] / elapsed if elapsed > 0 else 0.0
                bar.update(1)
                bar.set_postfix(tokens_per_s=f"{rate:.0f}")
                if reporter:
                    remaining = len(todo) - state["done"]
                    reporter.report(
                        samples=config.num_samples - remaining,
                        totalSamples=config.num_samples,
                        tokensPerSecond=round(rate, 1),
                        etaSeconds=round(remaining * elapsed / state["done"]) if state["done"] else None,
                        force=remaining == 0,
                    )

        workers = [asyncio.create_task(worker()) for _ in range(config.concurrency)]
        try:
            await asyncio.gather(*workers)
        finally:
            for task in workers:
                task.cancel()
            bar.close()
    return state["tokens"]
