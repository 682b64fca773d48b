"""A vLLM KV connector that hands out the target hidden states captured by `extract_hidden_states`.

vLLM's `extract_hidden_states` speculative method stores, for every prompt token, the residual
stream of the layers named in `eagle_aux_hidden_state_layer_ids` in a cache-only "KV cache"
layer. A KV connector reads them out when the request finishes. vLLM's example connector only
works on CUDA (pinned memory, CUDA streams); this one copies synchronously, so it runs on the
CPU build and on GPUs alike, and delivers through one of two transports (the server enables
each by configuring it; `transport` names the default, and a request may pick another with
`kv_transfer_params: {"hidden_states_transport": "file" | "zmq"}`):

- `file`: `<shared_storage_path>/<key>.safetensors` (`hidden_states [T, n, H]`, `token_ids [T]`),
  written to a temporary name and renamed, so a reader never sees half a file;
- `zmq`: one multipart message per request on a PUSH socket bound at `endpoint`; the consumer
  (eagle3_runtime/extract/streaming.py) connects a PULL socket; nothing touches the disk.

The response's `kv_transfer_params` carries `hidden_states_key` (and `hidden_states_path` for
`file`) so the client can match what it receives to its request.

Load it with `--kv-transfer-config '{"kv_connector": "Eagle3HiddenStatesConnector",
"kv_connector_module_path": "eagle3_runtime.connectors.hidden_states", "kv_role": "kv_producer",
"kv_connector_extra_config": {"transport": "file", "shared_storage_path": DIR}}'`.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch
from safetensors.torch import save_file
from vllm.config import VllmConfig, get_layers_from_vllm_config
from vllm.distributed.kv_transfer.kv_connector.v1.base import (
    KVConnectorBase_V1,
    KVConnectorMetadata,
    KVConnectorRole,
    SupportsHMA,
)
from vllm.distributed.parallel_state import get_tensor_model_parallel_rank
from vllm.logger import init_logger

if TYPE_CHECKING:
    from vllm.v1.core.sched.output import SchedulerOutput
    from vllm.v1.kv_cache_interface import KVCacheConfig
    from vllm.v1.request import Request

logger = init_logger(__name__)


def encode_message(key: str, token_ids: torch.Tensor, hidden_states: torch.Tensor) -> list[bytes]:
    """The zmq wire format: [key, header JSON, hidden-state bytes, token-id bytes]."""
    dtype = str(hidden_states.dtype).removeprefix("torch.")
    header = {"shape": list(hidden_states.shape), "dtype": dtype}
    raw = hidden_states.contiguous().view(torch.uint8).numpy().tobytes()
    return [key.encode(), json.dumps(header).encode(), raw, token_ids.to(torch.int64).numpy().tobytes()]


def decode_message(frames: list[bytes]) -> tuple[str, torch.Tensor, torch.Tensor]:
    key, header, raw, ids = frames
    meta = json.loads(header)
    if "error" in meta:
        raise RuntimeError(f"the extraction server could not deliver {key.decode()}: {meta['error']}")
    dtype = getattr(torch, meta["dtype"])
    hidden = torch.frombuffer(bytearray(raw), dtype=torch.uint8).view(dtype).reshape(meta["shape"])
    token_ids = torch.frombuffer(bytearray(ids), dtype=torch.int64)
    return key.decode(), token_ids, hidden


@dataclass
class Capture:
    req_id: str
    key: str
    token_ids: torch.Tensor
    block_ids: list[int]
    transport: str


@dataclass
class CaptureMetadata(KVConnectorMetadata):
    captures: list[Capture] = field(default_factory=list)


class Eagle3HiddenStatesConnector(KVConnectorBase_V1, SupportsHMA):
    """Store-only connector for `extract_hidden_states`; see the module docstring."""

    def __init__(self, vllm_config: VllmConfig, role: KVConnectorRole, kv_cache_config: KVCacheConfig):
        super().__init__(vllm_config=vllm_config, role=role, kv_cache_config=kv_cache_config)
        if vllm_config.speculative_config is None:
            raise ValueError("Eagle3HiddenStatesConnector needs the extract_hidden_states speculative method")
        extra = self._kv_transfer_config.get_from_extra_config
        self.storage_path = extra("shared_storage_path", None)
        self.endpoint = extra("endpoint", None)
        self.transport = extra("transport", "file" if self.storage_path else "zmq")
        self._check_transport(self.transport)
        self.group_id, self.block_size = self._hidden_state_group(vllm_config, kv_cache_config)
        draft_config = vllm_config.speculative_config.draft_model_config.hf_config
        self.layer_ids = list(getattr(draft_config, "eagle_aux_hidden_state_layer_ids", []))
        # Scheduler side: captures decided in request_finished, shipped with the next step's metadata.
        self._captures: list[Capture] = []
        # Worker side.
        self._cache: torch.Tensor | None = None
        self._is_writer = True
        self._socket = None
        self._delivered: set[str] = set()
        self._finished: set[str] = set()

    @staticmethod
    def _hidden_state_group(
        vllm_config: VllmConfig, kv_cache_config: KVCacheConfig | None
    ) -> tuple[int, int]:
        if kv_cache_config is None:
            return 0, vllm_config.cache_config.block_size
        from vllm.v1.kv_cache_interface import HiddenStateCacheSpec

        groups = kv_cache_config.kv_cache_groups
        ids = [i for i, g in enumerate(groups) if isinstance(g.kv_cache_spec, HiddenStateCacheSpec)]
        if len(ids) != 1 and len(groups) != 1:
            raise ValueError(f"expected one hidden-state cache group among {len(groups)}, found {len(ids)}")
        group = ids[0] if ids else 0
        return group, groups[group].kv_cache_spec.block_size

    def get_finished_count(self) -> int:
        return 1  # only tensor-parallel rank 0 delivers

    @classmethod
    def get_required_kvcache_layout(cls, vllm_config: VllmConfig) -> str | None:
        return "LBNHC"  # [blocks, heads(=layers), block_size, hidden]: one token's states together

    # ------------------------------------------------------------ scheduler side

    def get_num_new_matched_tokens(
        self, request: Request, num_computed_tokens: int
    ) -> tuple[int | None, bool]:
        return 0, False  # store-only

    def update_state_after_alloc(self, request, blocks, num_external_tokens: int) -> None:
        pass

    def build_connector_meta(self, scheduler_output: SchedulerOutput) -> KVConnectorMetadata:
        meta = CaptureMetadata(captures=self._captures)
        self._captures = []
        return meta

    def request_finished(self, request: Request, block_ids: list[int]) -> tuple[bool, dict[str, Any] | None]:
        if request.prompt_token_ids is None or not block_ids:
            return False, None
        key = request.request_id
        transport = (request.kv_transfer_params or {}).get("hidden_states_transport", self.transport)
        try:
            self._check_transport(transport)
        except ValueError as exc:
            logger.error("request %s: %s; its hidden states are not delivered", key, exc)
            return False, {"hidden_states_error": str(exc)}
        token_ids = torch.tensor(request.prompt_token_ids, dtype=torch.int64)
        self._captures.append(Capture(request.request_id, key, token_ids, list(block_ids), transport))
        params: dict[str, Any] = {
            "hidden_states_key": key,
            "hidden_states_layer_ids": self.layer_ids,
            "hidden_states_transport": transport,
        }
        if transport == "file":
            params["hidden_states_path"] = self._file_path(key)
        else:
            # The port only: the client reaches it on the host it sent the request to.
            params["hidden_states_port"] = int(self.endpoint.rsplit(":", 1)[1])
        # True: keep the blocks until the worker has read them (it reports them in get_finished).
        return True, params

    def request_finished_all_groups(
        self, request: Request, block_ids: tuple[list[int], ...]
    ) -> tuple[bool, dict[str, Any] | None]:
        if not 0 <= self.group_id < len(block_ids):
            return False, None
        return self.request_finished(request, block_ids[self.group_id])

    def _check_transport(self, transport: str) -> None:
        if transport not in ("file", "zmq"):
            raise ValueError(f"hidden-state transport must be file or zmq, not {transport!r}")
        if transport == "file" and not self.storage_path:
            raise ValueError("transport file needs kv_connector_extra_config.shared_storage_path")
        if transport == "zmq" and not self.endpoint:
            raise ValueError("transport zmq needs kv_connector_extra_config.endpoint (e.g. tcp://*:5600)")

    def _file_path(self, key: str) -> str:
        safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in key)
        return os.path.join(self.storage_path, f"{safe}.safetensors")

    # ------------------------------------------------------------ worker side

    def register_kv_caches(self, kv_caches: dict[str, torch.Tensor]) -> None:
        from vllm.model_executor.models.extract_hidden_states import CacheOnlyAttentionLayer

        self._is_writer = get_tensor_model_parallel_rank() == 0
        layers = list(
            get_layers_from_vllm_config(self._vllm_config, CacheOnlyAttentionLayer, list(kv_caches))
        )
        if len(layers) != 1:
            raise ValueError(f"expected one hidden-state cache layer, found {len(layers)}: {layers}")
        self._cache = kv_caches[layers[0]]
        if self._cache.shape[2] != self.block_size:
            raise ValueError(f"hidden-state cache block size {self._cache.shape[2]} != {self.block_size}")

    def start_load_kv(self, *args, **kwargs) -> None:
        pass

    def wait_for_layer_load(self, layer_name: str) -> None:
        pass

    def save_kv_layer(self, *args, **kwargs) -> None:
        pass  # the states are already in the cache; they are read once the request is done

    def wait_for_save(self) -> None:
        pass

    def get_finished(self, finished_req_ids: set[str]) -> tuple[set[str] | None, set[str] | None]:
        if self.has_connector_metadata():
            meta = self._get_connector_metadata()
            if isinstance(meta, CaptureMetadata):
                for capture in meta.captures:
                    if self._is_writer:
                        self._deliver(capture)
                    self._delivered.add(capture.req_id)
        self._finished |= finished_req_ids
        done = self._finished & self._delivered
        self._finished -= done
        self._delivered -= done
        return done or None, None

    def _read(self, capture: Capture) -> torch.Tensor:
        """[T, n_layers, H] on the CPU, gathered from the request's cache blocks."""
        blocks = torch.tensor(capture.block_ids, dtype=torch.long, device=self._cache.device)
        rows = self._cache[blocks]  # [blocks, n, block_size, H]
        per_token = rows.permute(0, 2, 1, 3).reshape(-1, rows.shape[1], rows.shape[3])
        return per_token[: capture.token_ids.shape[0]].to("cpu", copy=True).contiguous()

    def _deliver(self, capture: Capture) -> None:
        # A failed delivery must not take the engine down: the client gets the error instead.
        try:
            hidden = self._read(capture)
            if capture.transport == "file":
                path = self._file_path(capture.key)
                os.makedirs(os.path.dirname(path), exist_ok=True)
                save_file({"hidden_states": hidden, "token_ids": capture.token_ids}, f"{path}.tmp")
                os.replace(f"{path}.tmp", path)
            else:
                self._push(encode_message(capture.key, capture.token_ids, hidden))
        except Exception as exc:  # noqa: BLE001
            logger.exception("could not deliver the hidden states of %s", capture.key)
            error = f"{type(exc).__name__}: {exc}"
            if capture.transport == "file":
                with open(f"{self._file_path(capture.key)}.error", "w") as handle:
                    handle.write(error)
            else:
                self._push([capture.key.encode(), json.dumps({"error": error}).encode(), b"", b""])

    def _push(self, frames: list[bytes]) -> None:
        if self._socket is None:
            import zmq

            self._socket = zmq.Context.instance().socket(zmq.PUSH)
            self._socket.bind(self.endpoint)
        self._socket.send_multipart(frames)
