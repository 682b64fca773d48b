"""`eagle3 extract`: target hidden states of the generated conversations.

`--mode offline` writes shards to `hidden-states/` (docs/contracts.md). Without `--server` it
starts its own vLLM extraction server on `--target`; with `--server` the server must write its
files where this process reads them (`--scratch-dir`, a shared volume).

`--mode streaming` serves: it runs a vLLM extraction server whose connector streams the states
to the trainer (`eagle3 train --hidden-states streaming --server URL`) until it is stopped.
"""

from __future__ import annotations

import argparse
import logging
import signal
import threading
from pathlib import Path

import torch

from eagle3_api.stage_result import StageResult
from eagle3_api.workspace import Workspace
from eagle3_runtime.conversations import DEFAULT_MAX_LENGTH, iter_token_records
from eagle3_runtime.extract.offline import file_samples, with_target_top1, write_offline_shards
from eagle3_runtime.extract.server import start_extraction_server
from eagle3_runtime.hidden_states import MANIFEST, read_manifest
from eagle3_runtime.model.config import resolve_layer_ids
from eagle3_runtime.pinned_target import add_target_arguments, pin_target
from eagle3_runtime.progress import ProgressReporter
from eagle3_runtime.target import TargetHead, load_target_config
from eagle3_runtime.vllm_server import add_vllm_arg_argument

log = logging.getLogger(__name__)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--workspace", required=True, type=Path)
    parser.add_argument("--mode", choices=["offline", "streaming"], default="offline")
    add_target_arguments(parser)
    parser.add_argument("--server", help="a running extraction server (offline mode); default: start one")
    parser.add_argument("--layer-ids", default="auto", help="auto or three target layer ids, e.g. 2,16,29")
    parser.add_argument(
        "--max-length", type=int, default=DEFAULT_MAX_LENGTH, help="tokens per sample at most"
    )
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--samples-per-shard", type=int, default=64)
    parser.add_argument("--scratch-dir", type=Path, help="where the server's connector writes (offline)")
    parser.add_argument("--port", type=int, default=8000, help="HTTP port of the streaming server")
    parser.add_argument("--stream-port", type=int, default=5600, help="zmq port the states stream from")
    add_vllm_arg_argument(parser, "the extraction server it starts")


def _result(directory: Path, message: str) -> StageResult:
    manifest = read_manifest(directory)
    return StageResult(
        stage="extract",
        message=message,
        metrics={"samples": manifest.num_samples, "tokens": manifest.num_tokens},
        artifacts={"hidden_states": "hidden-states/manifest.json"},
    )


def run(args: argparse.Namespace) -> StageResult:
    workspace = Workspace(args.workspace)
    target = pin_target(args.target, args.target_revision)
    config = load_target_config(target.path)
    layer_ids = resolve_layer_ids(args.layer_ids, config.num_hidden_layers)
    if args.mode == "streaming":
        return _serve_streaming(args, target.path, workspace, layer_ids, config.num_hidden_layers)

    output = workspace.hidden_states_dir
    records = list(iter_token_records(workspace.data_dir, target.path, args.max_length))
    if not records:
        raise ValueError(f"{workspace.data_dir} has no conversations with tokens to learn")
    if (output / MANIFEST).exists():
        extracted = read_manifest(output)
        extracted.check_target(target, output)
        if extracted.num_samples >= len(records):
            return _result(output, "already extracted")
    scratch = args.scratch_dir or workspace.root / ".extract-scratch"
    scratch.mkdir(parents=True, exist_ok=True)
    # The target's head gives the top-1 stored with the states (on the GPU beside vLLM when there is one).
    head = TargetHead.from_pretrained(target.path, config).to("cuda" if torch.cuda.is_available() else "cpu")
    server = None
    if args.server is None:
        server = start_extraction_server(
            target.path,
            layer_ids,
            config.num_hidden_layers,
            log_path=workspace.root / "logs" / "extract-vllm.log",
            storage_dir=scratch.resolve(),
            max_model_len=args.max_length + 1,
            vllm_args=args.vllm_arg,
        )
    url = server.url if server else args.server

    def samples_for(pairs):
        files = file_samples(url, pairs, concurrency=args.concurrency, layer_ids=layer_ids)
        return with_target_top1(files, head)

    try:
        write_offline_shards(
            samples_for,
            records,
            output,
            layer_ids=layer_ids,
            num_hidden_layers=config.num_hidden_layers,
            hidden_size=config.hidden_size,
            samples_per_shard=args.samples_per_shard,
            reporter=ProgressReporter("extract", workspace.root),
            target=target,
        )
    finally:
        if server:
            server.stop()
    return _result(output, f"extracted layers {layer_ids} + last of {len(records)} samples")


def _serve_streaming(
    args, target: str, workspace: Workspace, layer_ids: list[int], num_hidden_layers: int
) -> StageResult:
    stopped = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stopped.set())
    server = start_extraction_server(
        target,
        layer_ids,
        num_hidden_layers,
        log_path=workspace.root / "logs" / "extract-stream-vllm.log",
        endpoint=f"tcp://*:{args.stream_port}",
        max_model_len=args.max_length + 1,
        host="0.0.0.0",
        port=args.port,
        vllm_args=args.vllm_arg,
    )
    log.info(
        "streaming extraction server on port %d (states on %d); stop with SIGTERM",
        args.port,
        args.stream_port,
    )
    try:
        stopped.wait()
    finally:
        server.stop()
    return StageResult(stage="extract", message="streaming extraction server stopped")
