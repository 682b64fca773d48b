"""Acceptance per context-length bucket (`eagle3 evaluate --context-lengths`): prompts of exactly
N tokens built from the evaluation prompts, run through the candidate server bucket by bucket, with
vLLM's `vllm:spec_decode_*` counters read around each bucket (as `rounds` does around a domain).

Prompt j of every bucket ends in the same question, the j-th evaluation prompt (taken round-robin
over the domains). Before it come the other prompts of the same mode, nearest first (j-1, j-2, ...,
wrapping around, each at most once): chat prompts as one long conversation rendered by the
target's chat template (system messages left out, consecutive user messages joined, so that
templates which insist on alternating roles render it), completion prompts as their texts joined
by blank lines. The rendering is cut from the front to exactly N tokens, keeping the tokenizer's
BOS token first when the rendering starts with it. Buckets thus differ only in how much context
precedes the same questions. When the prompts cannot make N tokens before every question, the
bucket is reported as unfilled and is not measured: never silently shorter.

The prompts go to `/v1/completions` as token ids, and the server's own count of prompt tokens is
checked against N.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import aiohttp

from eagle3_runtime.conversations import as_vllm_renders, load_tokenizer
from eagle3_runtime.evaluate.config import EvaluateConfig
from eagle3_runtime.evaluate.counters import read_spec_counters
from eagle3_runtime.prompt_sources import Prompt, load_prompts
from eagle3_runtime.vllm_client import open_session, post_once

SYSTEM_ROLES = ("system", "developer")


@dataclass(frozen=True)
class ContextBucket:
    context_length: int
    prompts: list[list[int]]  # token ids, each exactly `context_length` long; empty when unfilled
    unfilled: str | None = None  # why the evaluation prompts could not fill it


def chat_messages(prompt: Prompt, *, as_question: bool) -> list[dict[str, Any]]:
    """A chat prompt's messages as part of a long conversation: the source's assistant replies
    kept, system messages left out (a long conversation's front is cut off anyway); as the closing
    question, without trailing assistant replies."""
    messages: list[dict[str, Any]] = []
    for turn in prompt.turns or []:
        messages += turn.context
        if turn.source_reply is not None:
            messages.append(turn.source_reply)
    messages = [m for m in messages if m["role"] not in SYSTEM_ROLES]
    while as_question and messages and messages[-1]["role"] == "assistant":
        messages.pop()
    if as_question and (not messages or messages[-1]["role"] not in ("user", "tool")):
        raise ValueError(f"{prompt.location}: no user turn to end a long conversation with")
    return messages


def join_user_runs(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Consecutive user messages (prompts without a source reply) joined into one."""
    joined: list[dict[str, Any]] = []
    for message in messages:
        if joined and message["role"] == "user" and joined[-1]["role"] == "user":
            joined[-1] = {**joined[-1], "content": f"{joined[-1]['content']}\n\n{message['content']}"}
        else:
            joined.append(message)
    return joined


def chat_renderer(tokenizer) -> Callable[[list[Prompt]], list[int]]:
    """Token ids of chat prompts (the last one the question) as one conversation, as vLLM's chat
    endpoint renders it: the template with the generation prompt, no special tokens added."""
    if not getattr(tokenizer, "chat_template", None):
        raise ValueError("the target's tokenizer has no chat template; use completion-mode prompts")

    def render(prompts: list[Prompt]) -> list[int]:
        messages = [m for p in prompts[:-1] for m in chat_messages(p, as_question=False)]
        messages = join_user_runs(messages + chat_messages(prompts[-1], as_question=True))
        text = tokenizer.apply_chat_template(
            as_vllm_renders(messages), tokenize=False, add_generation_prompt=True
        )
        return list(tokenizer(text, add_special_tokens=False)["input_ids"])

    return render


def completion_renderer(tokenizer) -> Callable[[list[Prompt]], list[int]]:
    """Token ids of completion prompts' texts joined by blank lines, as vLLM's completions
    endpoint tokenizes a text (special tokens added)."""

    def render(prompts: list[Prompt]) -> list[int]:
        return list(tokenizer("\n\n".join(p.text or "" for p in prompts))["input_ids"])

    return render


def cut_from_front(ids: Sequence[int], length: int, bos_token_id: int | None) -> list[int] | None:
    """The last `length` tokens of `ids` (BOS kept first when `ids` starts with it), or None when
    `ids` is shorter."""
    if len(ids) < length:
        return None
    if bos_token_id is not None and ids[0] == bos_token_id:
        return [bos_token_id, *ids[len(ids) - length + 1 :]]
    return list(ids[len(ids) - length :])


def long_rendering(
    question: int, pool: Sequence[Prompt], length: int, render: Callable[[list[Prompt]], list[int]]
) -> list[int]:
    """The rendering of pool[question] after as many of the others (nearest first) as it takes to
    reach `length` tokens, or all of them when they do not."""
    others = [pool[(question - k) % len(pool)] for k in range(1, len(pool))]
    taken = 0
    ids = render([pool[question]])
    # Rows are added in doubling chunks: a handful of renderings, not one per row.
    while len(ids) < length and taken < len(others):
        taken = min(len(others), max(1, 2 * taken))
        ids = render([*reversed(others[:taken]), pool[question]])
    return ids


def questions(prompts: Sequence[Prompt], count: int) -> list[int]:
    """Indices of `count` prompts taken round-robin over the domains (in name order)."""
    by_domain: dict[str, list[int]] = {}
    for index, prompt in enumerate(prompts):
        by_domain.setdefault(prompt.domain, []).append(index)
    queues = [by_domain[d] for d in sorted(by_domain)]
    chosen: list[int] = []
    depth = 0
    while len(chosen) < count and depth < max(map(len, queues)):
        chosen += [q[depth] for q in queues if depth < len(q)]
        depth += 1
    return chosen[:count]


def build_buckets(
    prompts: Sequence[Prompt], context_lengths: Sequence[int], count: int, tokenizer
) -> list[ContextBucket]:
    """`count` prompts of exactly N tokens for each N of `context_lengths`."""
    renderers = {
        "chat": lambda: chat_renderer(tokenizer),
        "completion": lambda: completion_renderer(tokenizer),
    }
    longest = max(context_lengths)
    renderings = []  # (question's location, rendering long enough for the longest bucket)
    for index in questions(prompts, count):
        mode = "chat" if prompts[index].turns is not None else "completion"
        pool = [p for p in prompts if (p.turns is not None) == (mode == "chat")]
        question = next(i for i, p in enumerate(pool) if p is prompts[index])
        renderings.append(
            (prompts[index].location, long_rendering(question, pool, longest, renderers[mode]()))
        )
    buckets = []
    for length in context_lengths:
        cut = [cut_from_front(ids, length, tokenizer.bos_token_id) for _, ids in renderings]
        if all(ids is not None for ids in cut):
            buckets.append(ContextBucket(length, cut))  # type: ignore[arg-type]
            continue
        location, ids = min(renderings, key=lambda r: len(r[1]))
        buckets.append(
            ContextBucket(
                length,
                [],
                unfilled=f"the evaluation prompts make at most {len(ids)} tokens of context ending in "
                f"{location}, fewer than {length}",
            )
        )
    return buckets


async def _complete(session: aiohttp.ClientSession, model: str, ids: list[int], max_tokens: int) -> int:
    """One greedy completion of a token-id prompt; the number of tokens it generated."""
    body = {
        "model": model,
        "prompt": ids,
        "max_tokens": max_tokens,
        "temperature": 0.0,
        "return_token_ids": True,
    }
    reply = await post_once(session, "v1/completions", body, f"a {len(ids)}-token prompt")
    choice = reply["choices"][0]
    seen = len(choice.get("prompt_token_ids") or [])
    if seen != len(ids):
        raise RuntimeError(f"sent a prompt of {len(ids)} tokens, the server counted {seen}")
    return len(choice.get("token_ids") or [])


async def _measure_bucket(
    session: aiohttp.ClientSession,
    model: str,
    bucket: ContextBucket,
    max_tokens: int,
    concurrency: int,
    k: int,
) -> dict[str, Any]:
    gate = asyncio.Semaphore(concurrency)

    async def one(ids: list[int]) -> int:
        async with gate:
            return await _complete(session, model, ids, max_tokens)

    before = await read_spec_counters(session)
    started = time.monotonic()
    tokens = sum(await asyncio.gather(*(one(ids) for ids in bucket.prompts)))
    seconds = time.monotonic() - started
    counters = await read_spec_counters(session) - before
    if not counters.drafts:
        raise RuntimeError(
            f"the server made no speculative drafts on the {bucket.context_length}-token prompts"
        )
    return {
        "context_length": bucket.context_length,
        "prompts": len(bucket.prompts),
        "acceptance_length": counters.acceptance_length,
        "acceptance_per_position": counters.acceptance_per_position(k),
        "drafts": counters.drafts,
        "tokens": tokens,
        "seconds": round(seconds, 3),
    }


def measure_buckets(
    server_url: str,
    model: str,
    buckets: Sequence[ContextBucket],
    *,
    max_tokens: int,
    concurrency: int,
    num_speculative_tokens: int,
) -> list[dict[str, Any]]:
    """Each bucket's acceptance from the server's counter deltas, bucket by bucket; an unfilled
    bucket is reported with why."""

    async def run() -> list[dict[str, Any]]:
        async with open_session(server_url, concurrency) as session:
            measured = []
            for bucket in buckets:
                if bucket.unfilled:
                    measured.append(
                        {"context_length": bucket.context_length, "prompts": 0, "unfilled": bucket.unfilled}
                    )
                    continue
                measured.append(
                    await _measure_bucket(
                        session, model, bucket, max_tokens, concurrency, num_speculative_tokens
                    )
                )
            return measured

    return asyncio.run(run())


def evaluation_buckets(config: EvaluateConfig) -> list[ContextBucket]:
    """The buckets of `config.context_lengths`, from every row of the evaluation prompts (none
    when no context length is asked for); built before any server starts."""
    if not config.context_lengths:
        return []
    per_source, _ = load_prompts(config.prompts, on_bad_row="fail")
    prompts = [prompt for source in per_source for prompt in source]
    return build_buckets(
        prompts, config.context_lengths, config.context_prompts, load_tokenizer(config.target)
    )
