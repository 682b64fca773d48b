"""CPU tokens/s of the draft trainer at the tiny test configuration (the vLLM acceptance test's).

    python benchmarks/trainer/cpu_tiny.py [--steps 20] [--threads 2]

Synthetic target states of the tiny target's shapes (4 layers, hidden 256, vocab 4096);
3 TTT steps, rows of 512 tokens, 2 rows per step. Prints one JSON line.
"""

from __future__ import annotations

import argparse
import json
import platform
import time

import torch
from transformers import LlamaConfig

from eagle3_runtime.model.config import draft_config_from_target
from eagle3_runtime.model.loss import ttt_loss
from eagle3_runtime.model.vocab import DraftVocab
from eagle3_runtime.target import TargetHead
from eagle3_runtime.train.distributed import init_distributed
from eagle3_runtime.train.synthetic import synthetic_samples, synthetic_target
from eagle3_runtime.train.trainer import DraftTrainer, TrainSettings

TINY = dict(
    hidden_size=256,
    intermediate_size=688,
    num_attention_heads=4,
    num_key_value_heads=4,
    head_dim=64,
    num_hidden_layers=4,
    vocab_size=4096,
    max_position_embeddings=1024,
)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--seq-len", type=int, default=512)
    parser.add_argument("--ttt-steps", type=int, default=3)
    parser.add_argument(
        "--compile",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="torch.compile the TTT loss (default: the trainer's default for the device)",
    )
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    config = LlamaConfig(**TINY)
    target = synthetic_target(config.vocab_size, config.hidden_size)
    draft_config = draft_config_from_target(config, layer_ids="auto", draft_vocab_size=config.vocab_size)
    settings = TrainSettings(
        steps=args.steps + 2,
        learning_rate=1e-3,
        batch_tokens=2 * args.seq_len,
        seq_len=args.seq_len,
        ttt_steps=args.ttt_steps,
        compile=args.compile,
    )
    trainer = DraftTrainer(
        settings=settings,
        draft_config=draft_config,
        vocab=DraftVocab.full(config.vocab_size),
        embeddings=target["embeddings"],
        target_head=TargetHead(target["norm"], target["lm_head"], 1e-6),
        source=lambda: synthetic_samples(target, num_samples=64, length=400),
        context=init_distributed("cpu"),
        show_progress_bar=False,
    )
    for _ in range(2):  # warm-up
        trainer.train_step()
    started, tokens = time.perf_counter(), 0
    for _ in range(args.steps):
        tokens += trainer.train_step()["tokens"]
    elapsed = time.perf_counter() - started
    print(
        json.dumps(
            {
                "benchmark": "trainer-cpu-tiny",
                "tokens_per_second": round(tokens / elapsed, 1),
                "steps": args.steps,
                "threads": args.threads,
                "seq_len": args.seq_len,
                "ttt_steps": args.ttt_steps,
                "compile": trainer.loss_fn is not ttt_loss,
                "torch": torch.__version__,
                "cpu": platform.processor() or platform.machine(),
            }
        )
    )


if __name__ == "__main__":
    main()
