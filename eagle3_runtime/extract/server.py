"""A vLLM server that captures hidden states instead of generating: its configuration, and the request.

The server runs the `extract_hidden_states` speculative method with the aux layer ids plus the
last layer (id L: the output of the last decoder layer before the final norm), so each prompt
token gets exactly the `[4, H]` states of a `HiddenStateSample`. The project's connector
(eagle3_runtime/connectors/hidden_states.py) hands them out by file or by zmq stream.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

import aiohttp

from eagle3_runtime.command_line import flags
from eagle3_runtime.vllm_client import post_once
from eagle3_runtime.vllm_server import VLLMServer

CONNECTOR_MODULE = "eagle3_runtime.connectors.hidden_states"
CONNECTOR_CLASS = "Eagle3HiddenStatesConnector"


def captured_layer_ids(layer_ids: list[int], num_hidden_layers: int) -> list[int]:
    """vLLM sorts and de-duplicates these, so they must already be distinct and increasing."""
    ids = [*layer_ids, num_hidden_layers]
    if ids != sorted(set(ids)):
        raise ValueError(f"layer ids {layer_ids} must be distinct, increasing and below {num_hidden_layers}")
    return ids


def extraction_server_args(
    layer_ids: list[int],
    num_hidden_layers: int,
    *,
    storage_dir: str | os.PathLike[str] | None = None,
    endpoint: str | None = None,
) -> tuple[dict, list[str]]:
    """(speculative config, extra command-line arguments) for an extraction server that delivers
    by file into `storage_dir` and/or by zmq stream at `endpoint` (the first one given is the default)."""
    import json

    if not storage_dir and not endpoint:
        raise ValueError("an extraction server needs a storage directory or a stream endpoint")
    extra_config = {"transport": "file" if storage_dir else "zmq"}
    if storage_dir:
        extra_config["shared_storage_path"] = str(storage_dir)
    if endpoint:
        extra_config["endpoint"] = endpoint
    speculative = {
        "method": "extract_hidden_states",
        "num_speculative_tokens": 1,
        "draft_model_config": {
            "hf_config": {
                "eagle_aux_hidden_state_layer_ids": captured_layer_ids(layer_ids, num_hidden_layers)
            }
        },
    }
    kv_transfer = {
        "kv_connector": CONNECTOR_CLASS,
        "kv_connector_module_path": CONNECTOR_MODULE,
        "kv_role": "kv_producer",
        "kv_connector_extra_config": extra_config,
    }
    # Whole prompts in one step and no shared prefix blocks: every request captures all its tokens.
    args = flags(
        {
            "--kv-transfer-config": json.dumps(kv_transfer),
            "--no-enable-chunked-prefill": True,
            "--no-enable-prefix-caching": True,
        }
    )
    return speculative, args


def start_extraction_server(
    target: str | os.PathLike[str],
    layer_ids: list[int],
    num_hidden_layers: int,
    *,
    log_path: Path,
    storage_dir: str | os.PathLike[str] | None = None,
    endpoint: str | None = None,
    max_model_len: int = 1024,
    served_model_name: str = "target",
    host: str = "127.0.0.1",
    port: int | None = None,
    vllm_args: Sequence[str] = (),
) -> VLLMServer:
    """An extraction server of the target; `vllm_args` (how the target is served: tensor parallelism,
    quantization, extraArgs) come before the extraction's own, which win where both set a flag."""
    speculative, args = extraction_server_args(
        layer_ids, num_hidden_layers, storage_dir=storage_dir, endpoint=endpoint
    )
    server = VLLMServer(
        target,
        log_path=log_path,
        served_model_name=served_model_name,
        max_model_len=max_model_len,
        speculative_config=speculative,
        extra_args=[*vllm_args, *args],
        host=host,
        port=port,
    )
    return server.start()


async def request_hidden_states(
    session: aiohttp.ClientSession, model: str, token_ids: list[int], transport: str
) -> dict:
    """Prefill `token_ids` once (one generated token, discarded); returns the kv_transfer_params."""
    body = {
        "model": model,
        "prompt": token_ids,
        "max_tokens": 1,
        "temperature": 0.0,
        "kv_transfer_params": {"hidden_states_transport": transport},
    }
    reply = await post_once(session, "v1/completions", body, "extraction request failed")
    params = reply.get("kv_transfer_params") or {}
    if "hidden_states_error" in params:
        raise RuntimeError(f"the extraction server refused: {params['hidden_states_error']}")
    if "hidden_states_key" not in params:
        raise RuntimeError(
            "the server returned no hidden_states_key: is it an extraction server "
            f"(extract_hidden_states + {CONNECTOR_CLASS})?"
        )
    return params


async def served_model(session: aiohttp.ClientSession) -> str:
    """The name the server serves its model under."""
    async with session.get("v1/models", timeout=aiohttp.ClientTimeout(total=60)) as response:
        response.raise_for_status()
        return (await response.json(content_type=None))["data"][0]["id"]
