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
from typing import Any, Literal

import httpx

from eagle3_runtime.conversations import (
    DEFAULT_MAX_LENGTH,
    FORMAT,
    MANIFEST,
    ConversationRecord,
    Mode,
    generation_entry,
)
from eagle3_runtime.layout import write_json_atomic
from eagle3_runtime.progress import ProgressReporter

log = logging.getLogger(__name__)
# One INFO line per request would drown the progress bar and the retry messages.
logging.getLogger("httpx").setLevel(logging.WARNING)

PLAN_FILE = "plan.json"
BAD_ROWS_FILE = "bad-rows.jsonl"
REJECTED_FILE = "rejected.jsonl"
LONG_SAMPLES_FILE = "long-samples.jsonl"
DATA_SUFFIXES = (".jsonl", ".json", ".parquet", ".arrow")
RETRYABLE_STATUS = {408, 409, 425, 429, 500, 502, 503, 504}
RegenerateTurns = Literal["all", "last"]
LongSamplePolicy = Literal["truncate", "skip"]


# ---------------------------------------------------------------- sources


@dataclass(frozen=True)
class SourceSpec:
    """One `--source PATH[,mode=...][,weight=...][,prompt-field=...][,messages-field=...][,tools-field=...]` argument."""

    path: str
    mode: Mode = "chat"
    weight: float = 1.0
    prompt_field: str = "prompt"
    messages_field: str = "messages"
    tools_field: str = "tools"
    domain: str | None = None  # fixed domain label; default: the field `domain_field`, else the file name
    domain_field: str = "domain"

    @classmethod
    def parse(cls, text: str) -> SourceSpec:
        path, *options = text.split(",")
        if not path:
            raise ValueError(f"--source {text!r}: no path")
        known = {"mode", "weight", "prompt-field", "messages-field", "tools-field", "domain", "domain-field"}
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
class Turn:
    """One assistant turn the target generates: the messages that precede it (after the turns
    generated before), and the source's own assistant message there, if any (its tool calls
    decide whether the tool results that follow it fit the target's calls)."""

    context: list[dict[str, Any]]
    source_reply: dict[str, Any] | None = None


@dataclass
class Prompt:
    source: int
    domain: str
    location: str  # "file:line" (or "file:row N"), for messages about this row
    turns: list[Turn] | None = None  # chat mode
    tools: list[dict[str, Any]] | None = None  # chat mode
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


SHAREGPT_ROLES = {
    "human": "user",
    "user": "user",
    "gpt": "assistant",
    "assistant": "assistant",
    "system": "system",
    "tool": "tool",
    "observation": "tool",
}
MESSAGE_ROLES = {"system", "developer", "user", "assistant", "tool"}


def _normalise_message(turn: Any) -> dict[str, Any]:
    """An OpenAI-style message (or a ShareGPT `from`/`value` turn) with the fields templates use."""
    if not isinstance(turn, dict):
        raise ValueError("each message must be an object")
    if turn.get("role") is not None:
        role, content = turn["role"], turn.get("content")
    elif turn.get("from") in SHAREGPT_ROLES:
        role, content = SHAREGPT_ROLES[turn["from"]], turn.get("value")
    else:
        raise ValueError("each message needs a role (or a ShareGPT from: human/gpt/system/tool)")
    if role not in MESSAGE_ROLES:
        raise ValueError(f"unknown message role {role!r} (known: {', '.join(sorted(MESSAGE_ROLES))})")
    message: dict[str, Any] = {"role": role, "content": content}
    if role == "assistant":
        if turn.get("tool_calls"):
            message["tool_calls"] = [_normalise_tool_call(call) for call in turn["tool_calls"]]
        reasoning = next(
            (turn[k] for k in ("reasoning_content", "reasoning") if isinstance(turn.get(k), str)), None
        )
        if reasoning is not None:
            message["reasoning_content"] = reasoning
    if role == "tool":
        message.update({k: turn[k] for k in ("tool_call_id", "name") if isinstance(turn.get(k), str)})
    if content is None and "tool_calls" in message:
        message["content"] = ""
    elif not isinstance(content, str):
        raise ValueError(f"a {role} message needs a string content")
    return message


def _normalise_tool_call(call: Any) -> dict[str, Any]:
    function = call.get("function") if isinstance(call, dict) else None
    if not isinstance(function, dict) or not isinstance(function.get("name"), str):
        raise ValueError("each tool call needs a function with a name")
    arguments = function.get("arguments")
    if not isinstance(arguments, str):  # the OpenAI API (and vLLM's request model) wants a JSON string
        arguments = json.dumps(arguments or {})
    normalised = {"type": "function", "function": {"name": function["name"], "arguments": arguments}}
    return {"id": call["id"], **normalised} if isinstance(call.get("id"), str) else normalised


def _normalise_tools(value: Any) -> list[dict[str, Any]] | None:
    """A row's tool schemas in the shape vLLM's request model hands the chat template
    (`description` and `parameters` always present, `strict` only when set), so that a record
    re-renders here as the server rendered it. Hermes-style datasets store them as a JSON string."""
    if value in (None, "", []):
        return None
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError:
            raise ValueError("the tools field is a string but not JSON") from None
    if not isinstance(value, list):
        raise ValueError("the tools field must be a list of tool schemas")
    tools = []
    for tool in value:
        function = tool.get("function") if isinstance(tool, dict) else None
        if tool.get("type", "function") != "function" or not isinstance(function, dict):
            raise ValueError('each tool must be {"type": "function", "function": {...}}')
        if not isinstance(function.get("name"), str):
            raise ValueError("each tool's function needs a name")
        schema = {k: function.get(k) for k in ("name", "description", "parameters")}
        if function.get("strict") is not None:
            schema["strict"] = function["strict"]
        tools.append({"type": "function", "function": schema})
    return tools


def chat_turns(messages: list[dict[str, Any]], regenerate: RegenerateTurns) -> list[Turn]:
    """The assistant turns of a conversation the target generates, in order."""
    if regenerate == "last":
        while messages and messages[-1]["role"] == "assistant":
            messages = messages[:-1]
        if not messages or messages[-1]["role"] not in ("user", "tool"):
            raise ValueError("the conversation has no user turn to answer")
        return [Turn(messages)]
    turns, context = [], []
    for message in messages:
        if message["role"] != "assistant":
            context.append(message)
            continue
        if turns and not context:
            raise ValueError("two assistant turns in a row")
        turns.append(Turn(context, message))
        context = []
    if context:
        turns.append(Turn(context))
    if not any(m["role"] == "user" for m in turns[0].context):
        raise ValueError("no user message before the first assistant turn")
    for previous, turn in zip([None, *turns], turns, strict=False):
        results = [i for i, m in enumerate(turn.context) if m["role"] == "tool"]
        calls = previous.source_reply.get("tool_calls") if previous and previous.source_reply else None
        if results and (results != list(range(len(results))) or not calls):
            raise ValueError("a tool result that does not directly follow an assistant turn's tool calls")
    return turns


def _prompt_from_row(
    spec: SourceSpec, index: int, location: str, row: dict, file: Path, regenerate: RegenerateTurns
) -> Prompt:
    domain = spec.domain or str(row.get(spec.domain_field) or file.stem)
    if spec.mode == "completion":
        text = row.get(spec.prompt_field)
        if not isinstance(text, str) or not text:
            raise ValueError(f"field {spec.prompt_field!r} is missing or not a non-empty string")
        return Prompt(index, domain, location, text=text)
    if row.get(spec.messages_field) is not None:
        value = row[spec.messages_field]
        if not isinstance(value, list) or not value:
            raise ValueError("messages must be a non-empty list")
        messages = [_normalise_message(turn) for turn in value]
    elif isinstance(row.get(spec.prompt_field), str) and row[spec.prompt_field]:
        messages = [{"role": "user", "content": row[spec.prompt_field]}]
    else:
        raise ValueError(f"neither field {spec.messages_field!r} nor {spec.prompt_field!r} holds a prompt")
    tools = _normalise_tools(row.get(spec.tools_field))
    return Prompt(index, domain, location, turns=chat_turns(messages, regenerate), tools=tools)


def load_prompts(
    specs: list[SourceSpec], on_bad_row: str, regenerate: RegenerateTurns = "all"
) -> tuple[list[list[Prompt]], list[BadRow]]:
    """Every usable prompt per source; bad rows are refused (`fail`) or listed and skipped (`skip`)."""
    per_source, bad = [], []
    for index, spec in enumerate(specs):
        prompts = []
        for file in _source_files(Path(spec.path)):
            for location, row, reason in _raw_rows(file):
                if row is not None:
                    try:
                        prompts.append(_prompt_from_row(spec, index, location, row, file, regenerate))
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


@dataclass(frozen=True)
class ChatSettings:
    """How chat conversations are regenerated, and how long a sample may be."""

    regenerate_turns: RegenerateTurns = "all"
    chat_template_kwargs: dict[str, Any] | None = None
    max_length: int | None = DEFAULT_MAX_LENGTH  # None: whatever the server accepts
    long_samples: LongSamplePolicy = "truncate"


class RejectedRequest(Exception):
    """The server refused the request for good (a 4xx other than 429): retrying cannot help."""


class ContextTooLong(RejectedRequest):
    """The server refused a prompt longer than its context (vLLM: "... maximum context length ...")."""


class LongSample(Exception):
    """The sample does not fit the length limit and is left out."""


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
                refusal = ContextTooLong if "context length" in response.text else RejectedRequest
                raise refusal(f"HTTP {response.status_code}: {response.text[:300]}")
            problem, retry_after = f"HTTP {response.status_code}", response.headers.get("retry-after")
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
    client: httpx.AsyncClient,
    sample: str,
    prompt: Prompt,
    sampling: SamplingSettings,
    policy: RetryPolicy,
    chat: ChatSettings | None = None,
) -> ConversationRecord:
    """One sample (`sample` is its id, a number): a regenerated conversation or a completion.
    Without `chat` settings, prompts are as long as the server accepts."""
    generate = _generate_chat if prompt.turns is not None else _generate_completion
    return await generate(client, sample, prompt, sampling, chat or ChatSettings(max_length=None), policy)


async def _generate_chat(
    client: httpx.AsyncClient,
    sample: str,
    prompt: Prompt,
    sampling: SamplingSettings,
    chat: ChatSettings,
    policy: RetryPolicy,
) -> ConversationRecord:
    """Regenerate the conversation's assistant turns in order, each conditioned on the ones before."""
    history: list[dict[str, Any]] = []
    generations: list[dict[str, Any]] = []
    previous_tokens: list[int] = []
    meta: dict[str, Any] = {"source": prompt.location}
    length = _LengthCheck(chat)
    for number, turn in enumerate(prompt.turns):
        context = turn.context
        if number:
            context, stopped = _next_context(history[-1], prompt.turns[number - 1], turn)
            if stopped:
                meta["stopped"] = f"turn {number + 1}: {stopped}"
                break
        body = {**_request(sampling, sample, number), "messages": history + context}
        if prompt.tools:
            body["tools"] = prompt.tools
        if chat.chat_template_kwargs:
            body["chat_template_kwargs"] = chat.chat_template_kwargs
        try:
            reply = await _post_with_retries(client, "/v1/chat/completions", body, policy)
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
    if length.truncated:
        meta["truncated"] = length.truncated
    return ConversationRecord(
        id=sample,
        mode="chat",
        domain=prompt.domain,
        messages=history,
        tools=prompt.tools,
        chat_template_kwargs=chat.chat_template_kwargs,
        generations=generations,
        meta=meta,
    )


async def _generate_completion(
    client: httpx.AsyncClient,
    sample: str,
    prompt: Prompt,
    sampling: SamplingSettings,
    chat: ChatSettings,
    policy: RetryPolicy,
) -> ConversationRecord:
    body = {**_request(sampling, sample, 0), "prompt": prompt.text}
    try:
        reply = await _post_with_retries(client, "/v1/completions", body, policy)
    except ContextTooLong as exc:
        raise LongSample(f"the server refused the prompt ({exc})") from exc
    choice = reply["choices"][0]
    prompt_ids, completion_ids = _token_ids(choice.get("prompt_token_ids"), choice.get("token_ids"))
    length = _LengthCheck(chat)
    length.keep(0, prompt_ids, completion_ids)
    meta = {"source": prompt.location}
    if length.truncated:
        meta["truncated"] = length.truncated
    return ConversationRecord(
        id=sample,
        mode="completion",
        domain=prompt.domain,
        prompt=prompt.text,
        completion=choice.get("text") or "",
        prompt_token_ids=prompt_ids,
        completion_token_ids=completion_ids,
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


# ---------------------------------------------------------------- the stage


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
        "chat": asdict(config.chat),
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
        tokens = asyncio.run(_generate_all(config, plan, todo, output, reporter))
    finally:
        output.close()
    seconds = time.monotonic() - started

    records = [
        ConversationRecord.from_json(line)
        for shard in range(output.num_shards)
        for line in _shard_lines(output_dir, shard)
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
        {"file": f"shard-{s:05d}.jsonl", "num_samples": len(_shard_lines(output_dir, s))}
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
    limits = httpx.Limits(max_connections=config.concurrency, max_keepalive_connections=config.concurrency)

    async with httpx.AsyncClient(base_url=config.server.rstrip("/"), limits=limits) as client:

        async def worker() -> None:
            while True:
                try:
                    index = queue.get_nowait()
                except asyncio.QueueEmpty:
                    return
                prompt = plan[index]
                try:
                    record = await generate_one(
                        client, sample_id(index), prompt, config.sampling, config.retry, config.chat
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
