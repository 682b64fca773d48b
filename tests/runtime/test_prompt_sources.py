"""How `eagle3 generate` reads chat sources: turns to regenerate, tool results, tool schemas, bad rows."""

from __future__ import annotations

import json

from eagle3_runtime.prompt_sources import SourceSpec, load_prompts

WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}
CALL = {"id": "c0", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "oslo"}'}}


def _load(tmp_path, rows, regenerate="all", **spec):
    source = tmp_path / "rows.jsonl"
    source.write_text("".join(json.dumps(row) + "\n" for row in rows))
    [prompts], bad = load_prompts([SourceSpec(path=str(source), **spec)], "skip", regenerate)
    return prompts, {b.location.rsplit(":", 1)[1]: b.reason for b in bad}


def test_every_assistant_turn_is_regenerated_with_the_messages_before_it(tmp_path):
    conversation = [
        {"from": "system", "value": "Be brief."},
        {"from": "human", "value": "Weather?"},
        {"role": "assistant", "content": None, "tool_calls": [CALL], "reasoning": "ask the tool"},
        {"from": "observation", "value": "sunny"},
        {"from": "gpt", "value": "Sunny."},
        {"role": "user", "content": "Thanks."},
    ]
    [prompt], bad = _load(tmp_path, [{"messages": conversation, "tools": json.dumps([WEATHER])}])
    assert not bad
    assert [[m["role"] for m in turn.context] for turn in prompt.turns] == [
        ["system", "user"],
        ["tool"],
        ["user"],
    ]
    # The source's replies say which tool results fit; the last turn answers the last user message.
    assert prompt.turns[0].source_reply == {
        "role": "assistant",
        "content": "",
        "tool_calls": [CALL],
        "reasoning_content": "ask the tool",
    }
    assert prompt.turns[1].source_reply["content"] == "Sunny." and prompt.turns[2].source_reply is None
    # Tool schemas in the shape vLLM hands the chat template.
    assert prompt.tools == [
        {
            "type": "function",
            "function": {"name": "get_weather", "description": None, "parameters": {"type": "object"}},
        }
    ]


def test_last_turn_mode_keeps_the_history_and_answers_the_last_message(tmp_path):
    call_with_object_arguments = {**CALL, "function": {"name": "get_weather", "arguments": {"city": "oslo"}}}
    conversation = [
        {"role": "user", "content": "Weather?"},
        {"role": "assistant", "content": "", "tool_calls": [call_with_object_arguments]},
        {"role": "tool", "tool_call_id": "c0", "content": "sunny"},
        {"role": "assistant", "content": "Sunny."},
    ]
    [prompt], bad = _load(tmp_path, [{"messages": conversation}], regenerate="last")
    assert not bad and len(prompt.turns) == 1 and prompt.tools is None
    # The history as it was, with tool-call arguments as the JSON string the OpenAI API carries.
    assert prompt.turns[0].context == [
        conversation[0],
        {**conversation[1], "tool_calls": [CALL]},
        conversation[2],
    ]


def test_malformed_conversations_are_bad_rows_with_their_line(tmp_path):
    user = {"role": "user", "content": "hi"}
    rows = [
        {"messages": [user, {"role": "tool", "content": "sunny"}]},
        {"messages": [user, {"role": "assistant", "content": "a"}, {"role": "assistant", "content": "b"}]},
        {"messages": [{"role": "system", "content": "s"}, {"role": "assistant", "content": "a"}, user]},
        {"messages": [user, {"role": "narrator", "content": "x"}]},
        {"messages": [user], "functions": [{"type": "function", "function": {"description": "no name"}}]},
        {"messages": [user], "functions": "[not json"},
        {"messages": [user], "functions": [WEATHER]},
    ]
    prompts, bad = _load(tmp_path, rows, tools_field="functions")
    assert len(prompts) == 1 and prompts[0].tools[0]["function"]["name"] == "get_weather"
    assert bad == {
        "1": "a tool result that does not directly follow an assistant turn's tool calls",
        "2": "two assistant turns in a row",
        "3": "no user message before the first assistant turn",
        "4": "unknown message role 'narrator' (known: assistant, developer, system, tool, user)",
        "5": "each tool's function needs a name",
        "6": "the tools field is a string but not JSON",
    }


def test_tools_field_is_a_source_option():
    spec = SourceSpec.parse("rows.jsonl,mode=chat,tools-field=functions")
    assert spec.tools_field == "functions" and SourceSpec.parse("rows.jsonl").tools_field == "tools"
