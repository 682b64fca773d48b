"""Prompt sources for `eagle3 generate` and `eagle3 evaluate`: the `--source`/`--prompts` spec,
the rows of its files (JSONL, Parquet, or a dataset directory of such files, plus Arrow files as
`datasets.save_to_disk` writes them) as prompts, and the seeded plan that assigns every sample
index to a source row.

A chat row becomes the list of assistant turns to regenerate (`chat_turns`): all of them in
order (`all`), or only the reply to the last user or tool message (`last`).
"""

from __future__ import annotations

import json
import logging
import random
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from eagle3_runtime.conversations import Mode

log = logging.getLogger(__name__)

DATA_SUFFIXES = (".jsonl", ".json", ".parquet", ".arrow")
RegenerateTurns = Literal["all", "last"]


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


def source_files(path: Path) -> list[Path]:
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
        for file in source_files(Path(spec.path)):
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
