"""`eagle3 generate` on a reasoning, tool-calling model family, against real vLLM.

The tiny target is served with a Qwen3-shaped chat template (tests/runtime/chat_shapes.py) and
vLLM's own `qwen3` reasoning parser and `hermes` tool parser. The tiny target cannot decide on
its own to think or to call a tool, so a real HTTP proxy adds a structured-outputs regex to each
request (a `<think>` block, then a tool call where the conversation offers tools and ends with a
user turn, else a short answer); vLLM enforces it while the target picks the tokens. Everything
else is what a Qwen3 deployment does: vLLM renders the template, parses the output into
`reasoning` / `tool_calls`, and renders the regenerated history on the next turn.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from eagle3_api.stage_result import StageResult
from eagle3_runtime.conversations import (
    as_vllm_renders,
    expand_generations,
    iter_records,
    load_tokenizer,
    record_sequences,
)
from eagle3_runtime.tiny_target import END_OF_TURN
from tests.runtime.chat_shapes import qwen3_style_target
from tests.runtime.conftest import SERVED_NAME
from tests.runtime.flaky_proxy import FlakyProxy
from tests.support.vllm_server import running_vllm

pytestmark = pytest.mark.slow

THINK = r"<think>\n[a-z][a-z ]{2,24}[a-z]\n</think>\n\n"
ANSWER = r"[a-z][a-z ]{2,24}[a-z]"
WEATHER_CALL = r'<tool_call>\n\{"name": "get_weather", "arguments": \{"city": "[a-z]{3,8}"\}\}\n</tool_call>'
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather in a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}
TIME = {
    "type": "function",
    "function": {"name": "get_time", "description": "Local time.", "parameters": None},
}


def _shape(body: dict) -> dict:
    thinking = (body.get("chat_template_kwargs") or {}).get("enable_thinking", True)
    calls_tool = bool(body.get("tools")) and body["messages"][-1]["role"] == "user"
    regex = (THINK if thinking else "") + (WEATHER_CALL if calls_tool else ANSWER)
    return {**body, "structured_outputs": {"regex": regex}}


@pytest.fixture(scope="module")
def family_server(tiny_target: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, str]]:
    model = qwen3_style_target(tiny_target, tmp_path_factory.mktemp("qwen3-style") / "model")
    parsers = [
        "--reasoning-parser", "qwen3", "--enable-auto-tool-choice", "--tool-call-parser", "hermes",
        # The regex holds from the first token, inside the think block too.
        "--structured-outputs-config", json.dumps({"enable_in_reasoning": True}),
    ]  # fmt: skip
    with (
        running_vllm(model, model.parent, served_model_name=SERVED_NAME, extra_args=parsers) as server,
        FlakyProxy(server.url, failures=[], rewrite=_shape) as proxy,
    ):
        yield model, proxy.url


def _run_generate(workspace: Path, server: str, source: str, *extra: str) -> StageResult:
    command = [
        sys.executable, "-m", "eagle3_runtime.cli", "generate", "--workspace", str(workspace),
        "--server", server, "--model", SERVED_NAME, "--max-tokens", "200", "--source", source,
        "--result-file", str(workspace / "result.json"), *extra,
    ]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    return StageResult.parse_message((workspace / "result.json").read_text())


def _check_faithful(record, tokenizer) -> None:
    """Each turn's prompt is the record's conversation before it, rendered with the record's tools
    and template arguments as vLLM renders it; each turn's text is what the target generated; every
    generated token is learned exactly once."""
    options = {"tools": record.tools, **(record.chat_template_kwargs or {})}
    messages = as_vllm_renders(record.messages)
    pairs = expand_generations(record.generations)
    # The generated turns: all of them, or (--regenerate-turns last) the last one.
    turns = [i for i, m in enumerate(messages) if m["role"] == "assistant"][-len(pairs) :]
    for turn, (prompt, completion), entry in zip(turns, pairs, record.generations, strict=True):
        before = tokenizer.apply_chat_template(
            messages[:turn], add_generation_prompt=True, tokenize=False, **options
        )
        assert prompt == tokenizer(before, add_special_tokens=False)["input_ids"], (
            f"turn {turn}: prompt differs"
        )
        # The turn's text as generated; the target may stop on any of its stop tokens (the tiny
        # target has two, <|end|> and <|eos|>), and the template ends a turn with <|end|>.
        assert entry["finish_reason"] in ("stop", "tool_calls")
        generated = tokenizer.decode(completion[:-1]) + END_OF_TURN
        whole = tokenizer.apply_chat_template(messages[: turn + 1], tokenize=False, **options)
        assert whole == before + generated + "\n", f"turn {turn}: the record re-renders otherwise"
    learned = [t for ids, mask in record_sequences(record, tokenizer) for t in ids[mask].tolist()]
    assert learned == [t for _, completion in pairs for t in completion]


def test_reasoning_and_tool_calls_are_regenerated_turn_by_turn(tmp_path, family_server):
    model, url = family_server
    tokenizer = load_tokenizer(str(model))
    reasoning_row = {
        "messages": [
            {"role": "user", "content": "Continue this code:\ndef f(x):\n"},
            {"role": "assistant", "content": "the source's reply"},
            {"role": "user", "content": "What comes next?\nclass C:\n"},
        ]
    }
    weather_row = {
        "functions": [WEATHER],
        "messages": [
            {"role": "user", "content": "Weather in Oslo?"},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": "call_0",
                        "type": "function",
                        "function": {"name": "get_weather", "arguments": '{"city": "oslo"}'},
                    }
                ],
            },
            {"role": "tool", "tool_call_id": "call_0", "content": "sunny, 21 C"},
            {"role": "assistant", "content": "It is sunny."},
        ],
    }
    time_row = {
        "functions": json.dumps([WEATHER, TIME]),  # Hermes-style datasets store the schemas as a JSON string
        "messages": [
            {"role": "user", "content": "Time in Oslo?"},
            {
                "role": "assistant",
                "content": "",
                "tool_calls": [
                    {"id": "call_0", "type": "function", "function": {"name": "get_time", "arguments": "{}"}}
                ],
            },
            {"role": "tool", "tool_call_id": "call_0", "content": "09:00"},
            {"role": "assistant", "content": "Nine."},
        ],
    }
    source = tmp_path / "family.jsonl"
    source.write_text("".join(json.dumps(row) + "\n" for row in (reasoning_row, weather_row, time_row)))

    result = _run_generate(
        tmp_path / "thinking", url, f"{source},tools-field=functions",
        "--num-samples", "3", "--chat-template-kwargs", '{"enable_thinking": true}',
    )  # fmt: skip
    assert result.metrics["samples"] == 3 and result.metrics["stopped_early"] == 1, result
    records = {r.meta["source"].rsplit(":", 1)[1]: r for r in iter_records(tmp_path / "thinking" / "data")}
    for record in records.values():
        assert record.chat_template_kwargs == {"enable_thinking": True}
        _check_faithful(record, tokenizer)

    # Reasoning: both turns keep their thinking; the second turn's prompt, like Qwen3's, drops the
    # first turn's (it precedes the last user message), so each turn is a training sequence of its own.
    reasoning = records["1"]
    first, second = (m for m in reasoning.messages if m["role"] == "assistant")
    assert (
        first["reasoning_content"].strip()
        and second["reasoning_content"].strip()
        and first["content"].strip()
    )
    prompts = [tokenizer.decode(prompt) for prompt, _ in expand_generations(reasoning.generations)]
    assert first["reasoning_content"].strip() not in prompts[1]
    assert len(record_sequences(reasoning, tokenizer)) == 2

    # Tools: the target's call, the source's result answering it under the target's call id, the answer.
    weather = records["2"]
    assert weather.tools == [WEATHER]
    call, result_message, answer = weather.messages[1:]
    assert call["tool_calls"][0]["function"]["name"] == "get_weather" and call["reasoning_content"].strip()
    assert result_message == {
        "role": "tool",
        "content": "sunny, 21 C",
        "tool_call_id": call["tool_calls"][0]["id"],
    }
    assert answer["content"] and "stopped" not in weather.meta
    assert "<tool_response>\nsunny, 21 C\n</tool_response>" in tokenizer.decode(
        expand_generations(weather.generations)[1][0]
    )

    # The target called get_weather where the source called get_time: its result cannot answer
    # that call, so the conversation ends after the call.
    time = records["3"]
    assert time.tools == [WEATHER, TIME] and [m["role"] for m in time.messages] == ["user", "assistant"]
    assert "get_time" in time.meta["stopped"]


def test_template_kwargs_reach_the_template_and_last_turn_mode_keeps_the_history(tmp_path, family_server):
    model, url = family_server
    tokenizer = load_tokenizer(str(model))
    messages = [
        {"role": "user", "content": "Continue this code:\ndef f(x):\n"},
        {"role": "assistant", "content": "the source's reply"},
        {"role": "user", "content": "What comes next?\nclass C:\n"},
    ]
    source = tmp_path / "chat.jsonl"
    source.write_text(json.dumps({"messages": messages}) + "\n")
    _run_generate(
        tmp_path / "no-thinking", url, str(source), "--num-samples", "1",
        "--chat-template-kwargs", '{"enable_thinking": false}', "--regenerate-turns", "last",
    )  # fmt: skip
    [record] = iter_records(tmp_path / "no-thinking" / "data")
    assert record.messages[:3] == messages and len(record.generations) == 1
    [(prompt, _)] = expand_generations(record.generations)
    assert tokenizer.decode(prompt).endswith("<|assistant|>\n<think>\n\n</think>\n\n")
    assert "reasoning_content" not in record.messages[3] and record.messages[3]["content"]
    _check_faithful(record, tokenizer)
