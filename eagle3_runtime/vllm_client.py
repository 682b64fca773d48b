"""A client of a vLLM OpenAI server for `eagle3 generate` and `eagle3 evaluate` (the server
itself: vllm_server.py): one sample per call, a conversation regenerated turn by turn through
`/v1/chat/completions` or a completion through `/v1/completions`, with the token ids vLLM
returns, retries with backoff on transient errors, and the long-sample policy.

Requests go through aiohttp, not httpx: with eight requests in flight, httpx's async connection
pool kept requests waiting seconds for a pooled connection (encode/httpx#3215), and `eagle3
generate` made 0.44x the throughput of `vllm bench serve` on the same server; docs/benchmarks.md
has the numbers since.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import random
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from typing import Any, Literal

import aiohttp

from eagle3_runtime.conversations import DEFAULT_MAX_LENGTH, ConversationRecord, generation_entry
from eagle3_runtime.prompt_sources import Prompt, RegenerateTurns, Turn

log = logging.getLogger(__name__)

RETRYABLE_STATUS = {408, 409, 425, 429, 500, 502, 503, 504}
LongSamplePolicy = Literal["truncate", "skip"]
Post = Callable[[str, int, dict[str, Any]], Awaitable[dict]]  # (path, turn, body) -> the server's reply


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


@dataclass(frozen=True)
class ChatSettings:
    """How chat conversations are regenerated, and how long a sample may be."""

    regenerate_turns: RegenerateTurns = "all"
    chat_template_kwargs: dict[str, Any] | None = None
    max_length: int | None = DEFAULT_MAX_LENGTH  # None: whatever the server accepts
    long_samples: LongSamplePolicy = "truncate"


def open_session(server_url: str, max_connections: int) -> aiohttp.ClientSession:
    """A session to a vLLM server at `server_url` (a path prefix is kept) with at most
    `max_connections` open; request paths are relative (`v1/completions`)."""
    return aiohttp.ClientSession(
        base_url=server_url.rstrip("/") + "/",
        connector=aiohttp.TCPConnector(limit=max_connections),
        timeout=aiohttp.ClientTimeout(total=None),  # each request sets its own
        trust_env=True,  # HTTP(S)_PROXY and NO_PROXY, as httpx honoured them
    )


@contextlib.contextmanager
def collector_frozen() -> Iterator[None]:
    """Requests in flight while the garbage collector leaves every object that exists now alone.

    A full collection rescans the loaded prompts and imported modules (torch, transformers) and
    stalls the event loop with requests waiting to be sent; `vllm bench serve` freezes its heap
    for the same reason."""
    gc.collect()
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


async def post_once(session: aiohttp.ClientSession, path: str, body: dict, what: str) -> dict:
    """One request, no retries: its JSON reply, or a RuntimeError naming `what` failed."""
    async with session.post(path, json=body, timeout=aiohttp.ClientTimeout(total=600)) as response:
        if response.status != 200:
            raise RuntimeError(f"{what}: HTTP {response.status}: {(await response.text())[:300]}")
        return await response.json(content_type=None)


class RejectedRequest(Exception):
    """The server refused the request for good (a 4xx other than 429): retrying cannot help."""


class ContextTooLong(RejectedRequest):
    """The server refused a prompt longer than its context (vLLM: "... maximum context length ...")."""


class LongSample(Exception):
    """The sample does not fit the length limit and is left out."""


async def _post_with_retries(
    session: aiohttp.ClientSession, path: str, body: dict, policy: RetryPolicy
) -> dict:
    timeout = aiohttp.ClientTimeout(total=policy.request_timeout_s)
    for attempt in range(1, policy.max_attempts + 1):
        try:
            async with session.post(path, json=body, timeout=timeout) as response:
                if response.status == 200:
                    return await response.json(content_type=None)
                status, text = response.status, await response.text(errors="replace")
                retry_after = response.headers.get("retry-after")
        except (aiohttp.ClientError, TimeoutError) as exc:
            problem, retry_after = f"{type(exc).__name__}: {exc}", None
        else:
            if status not in RETRYABLE_STATUS:
                refusal = ContextTooLong if "context length" in text else RejectedRequest
                raise refusal(f"HTTP {status}: {text[:300]}")
            problem = f"HTTP {status}"
        if attempt == policy.max_attempts:
            raise RuntimeError(f"{path} failed {attempt} times; last: {problem}")
        delay = min(policy.max_delay_s, policy.base_delay_s * 2 ** (attempt - 1)) * random.uniform(0.5, 1.0)
        if retry_after and retry_after.replace(".", "", 1).isdigit():
            delay = min(policy.max_delay_s, max(delay, float(retry_after)))
        log.info("%s: %s; retry %d/%d in %.1f s", path, problem, attempt, policy.max_attempts - 1, delay)
        await asyncio.sleep(delay)
    raise AssertionError("unreachable")


def _request(sampling: SamplingSettings, sample: str, turn: int) -> dict[str, Any]:
    """The sampling part of the request for one turn of a sample."""
    return {
        "model": sampling.model,
        "max_tokens": sampling.max_tokens,
        "temperature": sampling.temperature,
        "top_p": sampling.top_p,
        # Per-sample, per-turn seed: a regenerated sample is the same sample, whatever the run order.
        "seed": (sampling.seed * 1_000_003 + int(sample)) * 1_009 + turn,
        "return_token_ids": True,
    }


def _token_ids(prompt: list[int] | None, completion: list[int] | None) -> tuple[list[int], list[int]]:
    if prompt is None or completion is None:
        raise RuntimeError(
            "the server's reply carries no token ids; eagle3 generate needs a vLLM that honours "
            "return_token_ids (0.10.2 or later)"
        )
    return list(prompt), list(completion)


class _LengthCheck:
    """The long-sample policy, applied to each generation of one sample in turn."""

    def __init__(self, settings: ChatSettings):
        self.settings = settings
        self.truncated: str | None = None  # why the sample was cut, once it was

    def keep(self, turn: int, prompt: list[int], completion: list[int]) -> bool:
        """Whether the generation stays in the record; raises LongSample to leave the sample out."""
        limit, total = self.settings.max_length, len(prompt) + len(completion)
        if limit is None or total <= limit:
            return True
        reason = f"turn {turn + 1}: {total} tokens ({len(prompt)} of prompt), over the max length {limit}"
        nothing_left = len(prompt) >= limit
        if self.settings.long_samples == "skip":
            raise LongSample(reason)
        if nothing_left and turn == 0:
            raise LongSample(f"{reason}: nothing left to learn")
        self.truncated = f"{reason}: " + ("turn left out" if nothing_left else f"cut at {limit} tokens")
        return not nothing_left

    def refused(self, turn: int, exc: ContextTooLong) -> None:
        """A later turn the server refuses ends a truncated sample; a first one leaves it out."""
        reason = f"turn {turn + 1}: the server refused the prompt ({exc})"
        if self.settings.long_samples == "skip" or turn == 0:
            raise LongSample(reason) from exc
        self.truncated = f"{reason}: turn left out"


def _assistant_message(message: dict) -> dict[str, Any]:
    """The generated turn as a chat template reads it back."""
    reply: dict[str, Any] = {"role": "assistant", "content": message.get("content") or ""}
    # vLLM names the parsed reasoning `reasoning` (0.11+) or `reasoning_content` (earlier);
    # chat templates read `reasoning_content`.
    reasoning = message.get("reasoning", message.get("reasoning_content"))
    if reasoning is not None:
        reply["reasoning_content"] = reasoning
    if message.get("tool_calls"):
        reply["tool_calls"] = [
            {
                "id": c["id"],
                "type": "function",
                "function": {k: c["function"][k] for k in ("name", "arguments")},
            }
            for c in message["tool_calls"]
        ]
    return reply


def _next_context(reply: dict, previous: Turn, turn: Turn) -> tuple[list[dict], str | None]:
    """The next turn's context with the source's tool results answering the target's calls
    (under the target's call ids), or why the conversation cannot go on."""
    results = [m for m in turn.context if m["role"] == "tool"]
    calls = reply.get("tool_calls") or []
    if not calls and not results:
        return turn.context, None
    called = [c["function"]["name"] for c in calls]
    expected = [c["function"]["name"] for c in (previous.source_reply or {}).get("tool_calls") or []]
    if called != expected or len(results) != len(calls):
        return turn.context, (
            f"the target called {called or 'no tool'} where the source called {expected or 'no tool'} "
            f"({len(results)} tool results follow)"
        )
    answered = [{**result, "tool_call_id": call["id"]} for result, call in zip(results, calls, strict=True)]
    return answered + turn.context[len(results) :], None


async def generate_one(
    session: aiohttp.ClientSession,
    sample: str,
    prompt: Prompt,
    sampling: SamplingSettings,
    policy: RetryPolicy,
    chat: ChatSettings | None = None,
) -> ConversationRecord:
    """One sample (`sample` is its id, a number): a regenerated conversation or a completion.
    Without `chat` settings, prompts are as long as the server accepts."""
    chat = chat or ChatSettings(max_length=None)

    async def post(path: str, turn: int, body: dict[str, Any]) -> dict:
        return await _post_with_retries(session, path, {**_request(sampling, sample, turn), **body}, policy)

    length = _LengthCheck(chat)
    meta: dict[str, Any] = {"source": prompt.location}
    if prompt.turns is not None:
        fields = await _regenerate_conversation(post, prompt, chat, length, meta)
    else:
        fields = await _complete(post, prompt, length)
    if length.truncated:
        meta["truncated"] = length.truncated
    return ConversationRecord(id=sample, domain=prompt.domain, meta=meta, **fields)


async def _regenerate_conversation(
    post: Post, prompt: Prompt, chat: ChatSettings, length: _LengthCheck, meta: dict[str, Any]
) -> dict[str, Any]:
    """Regenerate the conversation's assistant turns in order, each conditioned on the ones before."""
    history: list[dict[str, Any]] = []
    generations: list[dict[str, Any]] = []
    previous_tokens: list[int] = []
    for number, turn in enumerate(prompt.turns):
        context = turn.context
        if number:
            context, stopped = _next_context(history[-1], prompt.turns[number - 1], turn)
            if stopped:
                meta["stopped"] = f"turn {number + 1}: {stopped}"
                break
        body: dict[str, Any] = {"messages": history + context}
        if prompt.tools:
            body["tools"] = prompt.tools
        if chat.chat_template_kwargs:
            body["chat_template_kwargs"] = chat.chat_template_kwargs
        try:
            reply = await post("v1/chat/completions", number, body)
        except ContextTooLong as exc:
            length.refused(number, exc)
            break
        choice = reply["choices"][0]
        prompt_ids, completion_ids = _token_ids(reply.get("prompt_token_ids"), choice.get("token_ids"))
        if not length.keep(number, prompt_ids, completion_ids):
            break
        history = body["messages"] + [_assistant_message(choice["message"])]
        generations.append(
            generation_entry(previous_tokens, prompt_ids, completion_ids, choice.get("finish_reason"))
        )
        previous_tokens = prompt_ids + completion_ids
        if length.truncated:
            break
    return dict(
        mode="chat",
        messages=history,
        tools=prompt.tools,
        chat_template_kwargs=chat.chat_template_kwargs,
        generations=generations,
    )


async def _complete(post: Post, prompt: Prompt, length: _LengthCheck) -> dict[str, Any]:
    try:
        reply = await post("v1/completions", 0, {"prompt": prompt.text})
    except ContextTooLong as exc:
        raise LongSample(f"the server refused the prompt ({exc})") from exc
    choice = reply["choices"][0]
    prompt_ids, completion_ids = _token_ids(choice.get("prompt_token_ids"), choice.get("token_ids"))
    length.keep(0, prompt_ids, completion_ids)
    return dict(
        mode="completion",
        prompt=prompt.text,
        completion=choice.get("text") or "",
        prompt_token_ids=prompt_ids,
        completion_token_ids=completion_ids,
        finish_reason=choice.get("finish_reason"),
    )
