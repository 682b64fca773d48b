"""A Qwen3-shaped chat template for the tiny target, and a model directory that uses it.

The tiny target's own template has no reasoning or tool blocks. This one has Qwen3's shape in the
tiny tokenizer's turn markers (`<|role|>` ... `<|end|>`): tool schemas in a system turn, `<think>`
blocks kept only in the assistant turns after the last user message (earlier ones are dropped,
as Qwen3's template does), `enable_thinking=false` writing an empty think block into the
generation prompt, `<tool_call>` JSON blocks, and tool results as `<tool_response>` in a user turn.
vLLM renders it, and its `qwen3` reasoning parser and `hermes` tool parser read the output.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

QWEN3_STYLE_TEMPLATE = r"""
{{- bos_token }}
{%- if tools %}
{{- '<|system|>\n' }}
{%- if messages[0].role == 'system' %}{{- messages[0].content + '\n\n' }}{%- endif %}
{{- '# Tools\n\n<tools>' }}
{%- for tool in tools %}{{- '\n' }}{{- tool | tojson }}{%- endfor %}
{{- '\n</tools>\n\nCall a function as <tool_call>\n{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call><|end|>\n' }}
{%- elif messages[0].role == 'system' %}
{{- '<|system|>\n' + messages[0].content + '<|end|>\n' }}
{%- endif %}
{%- set ns = namespace(multi_step_tool=true, last_query_index=messages|length - 1) %}
{%- for message in messages[::-1] %}
{%- set index = (messages|length - 1) - loop.index0 %}
{%- if ns.multi_step_tool and message.role == 'user' %}
{%- set ns.multi_step_tool = false %}
{%- set ns.last_query_index = index %}
{%- endif %}
{%- endfor %}
{%- for message in messages %}
{%- if message.content is string %}{%- set content = message.content %}{%- else %}{%- set content = '' %}{%- endif %}
{%- if message.role == 'user' or (message.role == 'system' and not loop.first) %}
{{- '<|' + message.role + '|>\n' + content + '<|end|>\n' }}
{%- elif message.role == 'assistant' %}
{%- set reasoning_content = '' %}
{%- if message.reasoning_content is string %}
{%- set reasoning_content = message.reasoning_content %}
{%- elif '</think>' in content %}
{%- set reasoning_content = content.split('</think>')[0].rstrip('\n').split('<think>')[-1].lstrip('\n') %}
{%- set content = content.split('</think>')[-1].lstrip('\n') %}
{%- endif %}
{%- if loop.index0 > ns.last_query_index and (loop.last or reasoning_content) %}
{{- '<|assistant|>\n<think>\n' + reasoning_content.strip('\n') + '\n</think>\n\n' + content.lstrip('\n') }}
{%- else %}
{{- '<|assistant|>\n' + content }}
{%- endif %}
{%- if message.tool_calls %}
{%- for tool_call in message.tool_calls %}
{%- if (loop.first and content) or not loop.first %}{{- '\n' }}{%- endif %}
{%- if tool_call.function %}{%- set tool_call = tool_call.function %}{%- endif %}
{{- '<tool_call>\n{"name": "' + tool_call.name + '", "arguments": ' }}
{%- if tool_call.arguments is string %}{{- tool_call.arguments }}{%- else %}{{- tool_call.arguments | tojson }}{%- endif %}
{{- '}\n</tool_call>' }}
{%- endfor %}
{%- endif %}
{{- '<|end|>\n' }}
{%- elif message.role == 'tool' %}
{%- if loop.first or messages[loop.index0 - 1].role != 'tool' %}{{- '<|user|>' }}{%- endif %}
{{- '\n<tool_response>\n' + content + '\n</tool_response>' }}
{%- if loop.last or messages[loop.index0 + 1].role != 'tool' %}{{- '<|end|>\n' }}{%- endif %}
{%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
{{- '<|assistant|>\n' }}
{%- if enable_thinking is defined and enable_thinking is false %}{{- '<think>\n\n</think>\n\n' }}{%- endif %}
{%- endif %}
"""


def qwen3_style_target(tiny_target: Path, directory: Path) -> Path:
    """A copy of the tiny target (weights linked) whose tokenizer carries the Qwen3-shaped template."""
    directory.mkdir(parents=True, exist_ok=True)
    for file in tiny_target.iterdir():
        if file.suffix == ".safetensors":
            (directory / file.name).symlink_to(file)
        else:
            shutil.copy(file, directory / file.name)
    (directory / "chat_template.jinja").write_text(QWEN3_STYLE_TEMPLATE)
    config_path = directory / "tokenizer_config.json"
    config = json.loads(config_path.read_text())
    config["chat_template"] = QWEN3_STYLE_TEMPLATE
    config_path.write_text(json.dumps(config, indent=2))
    return directory
