"""`eagle3 generate`: regenerate training conversations on-policy from a running vLLM target.

Prompts come from one or more sources (JSONL, Parquet, or a dataset directory of such files,
plus Arrow files as `datasets.save_to_disk` writes them), each with a mode (`chat` through
`/v1/chat/completions`, which applies the server's chat template, or `completion` through raw
`/v1/completions`), a weight and a field mapping. A fixed, seeded plan assigns every sample
index to a source row, so a restarted run asks for exactly the samples still missing.

A chat conversation is regenerated turn by turn (`--regenerate-turns all`, the default): each
assistant turn of the source is asked of the target in order, conditioned on the turns it
generated before, with the source's system, user and tool messages in between (a tool result
is kept where the target called the same tools as the source; otherwise the conversation ends
there). `last` keeps the source's earlier assistant turns and regenerates only the reply to
the last user (or tool) message. A row's `tools` and the run's `--chat-template-kwargs` go
with every request; reasoning (`reasoning_content`) and tool calls stay in the turns.

Samples longer than `--max-length` tokens are cut there (`--long-samples truncate`) or left
out (`skip`); either way each is listed in `long-samples.jsonl` with its source row and counted.

Output (docs/contracts.md, `data/`): `shard-NNNNN.jsonl` files of `ConversationRecord`s, each
holding the samples `[N*S, (N+1)*S)` in order, and `manifest.json` once all are done. While a
shard fills, finished records are appended to `shard-NNNNN.jsonl.partial` (one flushed line
each); a run killed at any moment resumes from those lines, dropping at most a torn last line,
so nothing is lost or duplicated.

This module is the run; its parts have modules of their own: the sources and the sample plan
(`prompt_sources`), the requests to vLLM (`vllm_client`), the resumable shards
(`conversation_shards`).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from eagle3_runtime.conversation_shards import (
    LONG_SAMPLES_FILE,
    REJECTED_FILE,
    ShardedOutput,
    sample_id,
    shard_lines,
    write_json_lines,
)
from eagle3_runtime.conversations import FORMAT, MANIFEST, ConversationRecord
from eagle3_runtime.files import write_json_atomic
from eagle3_runtime.progress import ProgressReporter
from eagle3_runtime.prompt_sources import Prompt, SourceSpec, load_prompts, sample_plan, source_files
from eagle3_runtime.vllm_client import (
    ChatSettings,
    LongSample,
    RejectedRequest,
    RetryPolicy,
    SamplingSettings,
    collector_frozen,
    generate_one,
    open_session,
)

log = logging.getLogger(__name__)

PLAN_FILE = "plan.json"
BAD_ROWS_FILE = "bad-rows.jsonl"


@dataclass
class GenerateConfig:
    server: str
    sources: list[SourceSpec]
    sampling: SamplingSettings
    num_samples: int
    chat: ChatSettings = field(default_factory=ChatSettings)
    concurrency: int = 8
    on_bad_row: str = "skip"
    samples_per_shard: int = 256
    retry: RetryPolicy = field(default_factory=RetryPolicy)
    target_revision: str | None = None  # the revision the server serves, recorded in the plan


@dataclass
class GenerateSummary:
    samples: int
    tokens: int
    tokens_per_second: float
    assistant_turns: int  # generations in chat records (one per regenerated assistant turn)
    bad_rows: int
    rejected: int
    long_samples_truncated: int
    long_samples_skipped: int
    stopped_early: int  # conversations ended where the target's tool calls left the source's
    resumed: int
    seconds: float


def _plan_fingerprint(config: GenerateConfig) -> dict:
    """What the sample plan depends on; a resumed run must match it."""
    sources = []
    for spec in config.sources:
        files = source_files(Path(spec.path))
        digest = hashlib.sha256()
        for file in files:
            digest.update(f"{file.name}:{file.stat().st_size}:{file.stat().st_mtime_ns}".encode())
        sources.append({**asdict(spec), "files": digest.hexdigest()[:16]})
    return {
        "sources": sources,
        "num_samples": config.num_samples,
        "samples_per_shard": config.samples_per_shard,
        "sampling": asdict(config.sampling),
        "chat": asdict(config.chat),
        # Only when pinned, so plans written before revisions were recorded still resume.
        **({"target_revision": config.target_revision} if config.target_revision else {}),
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
    if config.chat.max_length is not None and config.chat.max_length < 2:
        raise ValueError("--max-length must be at least 2")
    if not config.sources:
        raise ValueError("give at least one --source")
    output_dir.mkdir(parents=True, exist_ok=True)
    if (output_dir / MANIFEST).exists():
        manifest = json.loads((output_dir / MANIFEST).read_text())
        log.info("%s is complete (%d samples); nothing to do", output_dir, manifest["samples"])
        return _summary_from_manifest(manifest)
    _check_plan(output_dir, _plan_fingerprint(config))

    per_source, bad_rows = load_prompts(config.sources, config.on_bad_row, config.chat.regenerate_turns)
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
        with collector_frozen():
            tokens = asyncio.run(_generate_all(config, plan, todo, output, reporter))
    finally:
        output.close()
    seconds = time.monotonic() - started

    records = [
        ConversationRecord.from_json(line)
        for shard in range(output.num_shards)
        for line in shard_lines(output_dir, shard)
    ]
    skipped = [
        json.loads(line)
        for line in output.set_aside[LONG_SAMPLES_FILE].values()
        if json.loads(line)["action"] == "skipped"
    ]
    truncated = [
        {"id": r.id, "location": r.meta["source"], "action": "truncated", "reason": r.meta["truncated"]}
        for r in records
        if "truncated" in r.meta
    ]
    write_json_lines(output_dir / LONG_SAMPLES_FILE, sorted(skipped + truncated, key=lambda e: e["id"]))
    summary = GenerateSummary(
        samples=len(records),
        tokens=sum(r.num_generated_tokens for r in records),
        tokens_per_second=round(tokens / seconds, 2) if seconds > 0 else 0.0,
        assistant_turns=sum(len(r.generations or []) for r in records),
        bad_rows=len(bad_rows),
        rejected=len(output.set_aside[REJECTED_FILE]),
        long_samples_truncated=len(truncated),
        long_samples_skipped=len(skipped),
        stopped_early=sum("stopped" in r.meta for r in records),
        resumed=resumed,
        seconds=round(seconds, 2),
    )
    shards = [
        {"file": f"shard-{s:05d}.jsonl", "num_samples": len(shard_lines(output_dir, s))}
        for s in range(output.num_shards)
    ]
    domains: dict[str, int] = {}
    for record in records:
        domains[record.domain] = domains.get(record.domain, 0) + 1
    write_json_atomic(
        output_dir / MANIFEST,
        {
            "format": FORMAT,
            "shards": shards,
            "domains": domains,
            "max_length": config.chat.max_length,
            "long_samples": config.chat.long_samples,
            "regenerate_turns": config.chat.regenerate_turns,
            **asdict(summary),
        },
    )
    return summary


async def _generate_all(
    config: GenerateConfig,
    plan: list[Prompt],
    todo: list[int],
    output: ShardedOutput,
    reporter: ProgressReporter | None,
) -> int:
    """Run the missing samples with at most `concurrency` conversations in flight; returns tokens generated."""
    from tqdm import tqdm

    queue: asyncio.Queue[int] = asyncio.Queue()
    for index in todo:
        queue.put_nowait(index)
    started = time.monotonic()
    state = {"tokens": 0, "done": 0}
    bar = tqdm(
        total=config.num_samples, initial=config.num_samples - len(todo), desc="generate", unit="sample"
    )

    async with open_session(config.server, config.concurrency) as session:

        async def worker() -> None:
            while True:
                try:
                    index = queue.get_nowait()
                except asyncio.QueueEmpty:
                    return
                prompt = plan[index]
                try:
                    record = await generate_one(
                        session, sample_id(index), prompt, config.sampling, config.retry, config.chat
                    )
                except LongSample as exc:
                    log.warning("sample %s (%s) left out: %s", sample_id(index), prompt.location, exc)
                    entry = {"location": prompt.location, "action": "skipped", "reason": str(exc)}
                    output.put_aside(index, LONG_SAMPLES_FILE, entry)
                except RejectedRequest as exc:
                    log.warning(
                        "sample %s (%s) refused by the server: %s", sample_id(index), prompt.location, exc
                    )
                    output.put_aside(index, REJECTED_FILE, {"location": prompt.location, "reason": str(exc)})
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
                        total_samples=config.num_samples,
                        tokens_per_second=round(rate, 1),
                        eta_seconds=round(remaining * elapsed / state["done"]) if state["done"] else None,
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
