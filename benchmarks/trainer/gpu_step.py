"""EAGLE-3 training-step throughput on one GPU: ours vs speculators 0.9.0, and MFU.

    python benchmarks/trainer/gpu_step.py --impl all          # peak matmul, ours, speculators
    torchrun --nproc-per-node 1 benchmarks/trainer/gpu_step.py --impl ours   # FSDP2 path
    # equal global batch: 1 GPU x 2 rows against 2 GPUs x 1 row (compare with loss_curves.py)
    torchrun --nproc-per-node 1 benchmarks/trainer/gpu_step.py --impl ours --rows-per-rank 2 --out a.json
    torchrun --nproc-per-node 2 benchmarks/trainer/gpu_step.py --impl ours --rows-per-rank 1 --out b.json

Shapes (Llama-3-8B-like target): hidden 4096, 32 heads / 8 KV heads, MLP 14336, target vocab
128256, draft vocab 32000, packed rows of 2048 tokens (one per GPU unless --rows-per-rank), 7 TTT
steps, synthetic target states (a pool of distinct rows; each rank takes its own slice of a
step). Both implementations get the same device-resident batches, bf16 autocast over fp32
master weights, fused AdamW, grad clipping at 1.0; each is warmed up (compiled) first.

Model FLOPs per token (for MFU) count what the step must compute: the draft's matmuls
forward and backward (weight and input gradients; `fc` has no input gradient), attention
scores and values over the TTT key pattern, and the target head's forward over the full
vocabulary. The peak is a bf16 8192^3 matmul measured in the same run.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import time
import warnings

import torch
from torch._dynamo.utils import counters

HIDDEN, HEADS, KV_HEADS, HEAD_DIM, MLP = 4096, 32, 8, 128, 14336
TARGET_VOCAB, DRAFT_VOCAB, LAYERS = 128256, 32000, 32
TINY = dict(HIDDEN=64, HEADS=4, KV_HEADS=2, HEAD_DIM=16, MLP=128, TARGET_VOCAB=1000, DRAFT_VOCAB=500)
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def sync() -> None:
    if DEVICE == "cuda":
        torch.cuda.synchronize()


def peak_memory_gib() -> float:
    return torch.cuda.max_memory_allocated() / 2**30 if DEVICE == "cuda" else 0.0


def target_config():
    from transformers import LlamaConfig

    return LlamaConfig(
        hidden_size=HIDDEN,
        intermediate_size=MLP,
        num_attention_heads=HEADS,
        num_key_value_heads=KV_HEADS,
        head_dim=HEAD_DIM,
        num_hidden_layers=LAYERS,
        vocab_size=TARGET_VOCAB,
        max_position_embeddings=8192,
        rms_norm_eps=1e-5,
        rope_parameters={"rope_type": "default", "rope_theta": 500000.0},
    )


def flops_per_token(seq_len: int, ttt_steps: int, *, lm_head_trained: bool, target_vocab: int) -> float:
    q, kv, o = 2 * HIDDEN * HEADS * HEAD_DIM, 2 * HIDDEN * KV_HEADS * HEAD_DIM, HEADS * HEAD_DIM * HIDDEN
    layer = q + 2 * kv + o + 3 * HIDDEN * MLP
    lm_head = HIDDEN * DRAFT_VOCAB
    per_step = 2 * 3 * layer + 2 * (3 if lm_head_trained else 2) * lm_head
    total = 0.0
    for i in range(ttt_steps):
        keys = (seq_len + 1) / 2 + i  # causal step-0 keys plus i diagonal keys
        total += per_step + 2 * 2 * keys * HEADS * HEAD_DIM * 3.5  # QK^T and PV: fwd + ~2.5x bwd
    total += 2 * 2 * 3 * HIDDEN * HIDDEN  # fc: forward + weight gradient
    total += 2 * HIDDEN * target_vocab  # target logits (speculators: only the draft vocabulary's rows)
    return total


def peak_matmul_tflops() -> float:
    n = 8192
    a, b = (
        torch.randn(n, n, device="cuda", dtype=torch.bfloat16),
        torch.randn(n, n, device="cuda", dtype=torch.bfloat16),
    )
    for _ in range(3):
        a @ b
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(10):
        start.record()
        a @ b
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    times.sort()
    return 2 * n**3 / times[len(times) // 2] / 1e12


def synthetic_batches(count: int, seq_len: int, device):
    """Random target states and a draft vocabulary: the same tensors for both implementations."""
    g = torch.Generator().manual_seed(0)
    target = {
        "embeddings": (torch.randn(TARGET_VOCAB, HIDDEN, generator=g) * 0.02).to(torch.bfloat16),
        "lm_head": (torch.randn(TARGET_VOCAB, HIDDEN, generator=g) * 0.02).to(torch.bfloat16),
        "norm": torch.ones(HIDDEN),
    }
    # Frequent ids: a Zipf-like choice makes the draft vocabulary cover most tokens, as in real data.
    weights = 1.0 / torch.arange(1, TARGET_VOCAB + 1, dtype=torch.float64) ** 1.1
    perm = torch.randperm(TARGET_VOCAB, generator=g)
    batches = []
    dtype = torch.bfloat16 if DEVICE == "cuda" else torch.float32  # states arrive in bf16 from vLLM
    for _ in range(count):
        ids = perm[torch.multinomial(weights, seq_len, replacement=True, generator=g)]
        batches.append(
            {
                "input_ids": ids[None].to(device),
                "aux": (torch.randn(1, seq_len, 3 * HIDDEN, generator=g)).to(dtype).to(device),
                "last": (torch.randn(1, seq_len, HIDDEN, generator=g) * 2).to(dtype).to(device),
                "loss_mask": torch.ones(1, seq_len, dtype=torch.bool, device=device),
            }
        )
    counts = torch.zeros(TARGET_VOCAB, dtype=torch.int64)
    for batch in batches:
        counts += torch.bincount(batch["input_ids"].flatten().cpu(), minlength=TARGET_VOCAB)
    counts += (weights[perm.argsort()] * 1e6).to(torch.int64)  # stable choice beyond the sampled ids
    return target, counts, batches


def rank_batches(pool: list[dict], rows_per_rank: int, rank: int, world_size: int) -> list[dict]:
    """This rank's share of each step's global batch, cycling through the pool.

    Step k takes global rows k*G .. k*G+G-1 (G = rows_per_rank * world_size), rank r the slice
    r*rows_per_rank onwards: 1 GPU x 2 rows and 2 GPUs x 1 row train on the same global batches.
    """
    global_rows = rows_per_rank * world_size
    if len(pool) % global_rows:
        raise ValueError(f"a pool of {len(pool)} rows does not divide into global batches of {global_rows}")
    batches = []
    for first in range(0, len(pool), global_rows):
        rows = pool[first + rank * rows_per_rank : first + (rank + 1) * rows_per_rank]
        batches.append({key: torch.cat([row[key] for row in rows]) for key in rows[0]})
    return batches


def timed(step, batches, warmup: int, steps: int) -> tuple[float, list[float]]:
    """Seconds of the `steps` after `warmup`, and the loss of every step (warmup included)."""
    losses = [step(batches[i % len(batches)]) for i in range(warmup)]
    sync()
    started = time.perf_counter()
    for i in range(warmup, warmup + steps):
        losses.append(step(batches[i % len(batches)]))
    sync()
    return time.perf_counter() - started, losses


def profile_steps(step, batches, path: str) -> None:
    """Where a step's GPU time goes: the top kernels of three profiled steps, written to `path`."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for i in range(3):
            step(batches[i % len(batches)])
        sync()
    table = prof.key_averages().table(sort_by="cuda_time_total", row_limit=40, max_name_column_width=70)
    with open(path, "w") as handle:
        handle.write(table)


def run_ours(args, target, counts, batches):
    from eagle3_runtime.model.config import draft_config_from_target
    from eagle3_runtime.model.loss import TTTBatch
    from eagle3_runtime.model.vocab import build_draft_vocab
    from eagle3_runtime.target import TargetHead
    from eagle3_runtime.train.distributed import init_distributed
    from eagle3_runtime.train.trainer import DraftTrainer, TrainSettings

    context = init_distributed()
    batches = rank_batches(batches, args.rows_per_rank, context.rank, context.world_size)
    vocab = build_draft_vocab(counts, DRAFT_VOCAB)
    draft_config = draft_config_from_target(target_config(), layer_ids="auto", draft_vocab_size=DRAFT_VOCAB)
    settings = TrainSettings(
        steps=10**6,
        learning_rate=1e-4,
        batch_tokens=args.seq_len * args.rows_per_rank * context.world_size,
        seq_len=args.seq_len,
        ttt_steps=args.ttt_steps,
        warmup_steps=1,
        attention=args.attention,
        freeze_lm_head=args.freeze_lm_head,
    )
    trainer = DraftTrainer(
        settings=settings,
        draft_config=draft_config,
        vocab=vocab,
        embeddings=target["embeddings"].float(),
        target_head=TargetHead(target["norm"], target["lm_head"], 1e-5),
        source=lambda: iter(()),
        context=context,
        show_progress_bar=False,
    )
    head = trainer.target_head
    seq = args.seq_len
    graphs_before = counters["stats"]["unique_graphs"]

    def step(b):
        batch = TTTBatch(
            input_ids=b["input_ids"],
            aux_hidden_states=b["aux"],
            target_logits=head(b["last"]),
            predict_mask=b["loss_mask"],
            document_ids=torch.zeros_like(b["input_ids"]),
            positions=torch.arange(seq, device=b["input_ids"].device).expand_as(b["input_ids"]),
        )
        return trainer.optimize(batch, b["input_ids"].numel(), time.perf_counter())["loss"]

    elapsed, losses = timed(step, batches, args.warmup, args.steps)
    if args.profile:
        profile_steps(step, batches, args.profile)
    return {
        "tokens_per_second": args.steps * seq * args.rows_per_rank * context.world_size / elapsed,
        "losses": losses,
        "world_size": context.world_size,
        "rows_per_rank": args.rows_per_rank,
        "peak_memory_gib": peak_memory_gib(),
        "compiled_graphs": counters["stats"]["unique_graphs"] - graphs_before,
    }


def speculators_draft_config(verifier_config):
    """The draft decoder config their trainer synthesises for eagle3 (`--num-layers` defaults to 1).

    Their Eagle3DraftModel builds `transformer_layer_config.num_hidden_layers` decoder layers, so
    passing the target's own config (32 layers) builds a 32-layer draft: that, not FlexAttention,
    is what ran the H200 out of memory, and its 32 cache layers (one `len(cache.layers)` guard
    each) are what exhausted the recompile limit. Their default sliding window (2048, all layers)
    masks nothing at sequence 2048, so full attention gives the same block mask here.
    """
    config = copy.deepcopy(verifier_config)
    config.num_hidden_layers = 1
    return config


def run_speculators(args, target, counts, batches):
    from speculators.config import SpeculatorsConfig, VerifierConfig
    from speculators.losses import resolve_loss_config
    from speculators.models.eagle3 import Eagle3SpeculatorConfig
    from speculators.models.eagle3.core import Eagle3DraftModel
    from speculators.proposals.greedy import GreedyTokenProposalConfig

    from eagle3_runtime.model.vocab import build_draft_vocab

    vocab = build_draft_vocab(counts, DRAFT_VOCAB)
    verifier_config = target_config()
    layer_config = speculators_draft_config(verifier_config)
    layer_config._attn_implementation = args.speculators_attention
    config = Eagle3SpeculatorConfig(
        transformer_layer_config=layer_config,
        draft_vocab_size=DRAFT_VOCAB,
        norm_before_residual=False,
        eagle_aux_hidden_state_layer_ids=[2, 16, 29],
        speculators_config=SpeculatorsConfig(
            algorithm="eagle3",
            proposal_methods=[GreedyTokenProposalConfig(speculative_tokens=args.ttt_steps)],
            default_proposal_method="greedy",
            verifier=VerifierConfig.from_config(verifier_config, name_or_path=None),
        ),
    )
    if DEVICE == "cpu" and not hasattr(Eagle3DraftModel.forward, "_torchdynamo_orig_callable"):
        # Their forward carries `torch.compile` (default options) only when CUDA is present. The CPU
        # dry run applies the same compile so the same graphs, guards and recompiles are exercised;
        # inductor has no FlexAttention backward on CPU, so it traces with aot_eager and lifts
        # flex's CPU-backward check (its reference math then runs: CPU memory numbers mean nothing).
        import torch.nn.attention.flex_attention as flex_module

        flex_module._validate_device = lambda *tensors: None
        Eagle3DraftModel.forward = torch.compile(Eagle3DraftModel.forward, backend="aot_eager")
    # Fail at once instead of their silent fallback to uncompiled flex, which materialises the scores.
    torch._dynamo.config.fail_on_recompile_limit_hit = True
    warnings.filterwarnings("error", message="flex_attention called without torch.compile")
    graphs_before = counters["stats"]["unique_graphs"]
    model = Eagle3DraftModel(config)
    model.load_vocab_mappings(vocab.t2d, vocab.d2t)
    with torch.no_grad():  # what load_verifier_weights would read from the verifier checkpoint
        model.embed_tokens.weight.copy_(target["embeddings"].float())
        rows = target["lm_head"][vocab.used_ids].float()
        model.verifier_lm_head.weight.copy_(rows)
        model.lm_head.weight.copy_(rows)
        model.verifier_norm.weight.copy_(target["norm"])
    model = model.to(DEVICE).train()
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=1e-4, betas=(0.9, 0.95), fused=DEVICE == "cuda")
    loss_config = resolve_loss_config("kl_div", args.speculators_loss)
    seq = args.seq_len

    def step(b):
        with torch.autocast(DEVICE, dtype=torch.bfloat16, enabled=DEVICE == "cuda"):
            _, loss, _ = model(
                hidden_states=b["aux"],
                input_ids=b["input_ids"],
                document_ids=torch.zeros_like(b["input_ids"]),
                loss_mask=b["loss_mask"],
                verifier_last_hidden_states=b["last"],
                ttt_steps=args.ttt_steps,
                ttt_step_loss_decay=0.8,
                loss_config=loss_config,
            )
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        return loss.item()

    elapsed, losses = timed(step, batches, args.warmup, args.steps)
    trainable = sum(p.numel() for p in params)
    return {
        "tokens_per_second": args.steps * seq / elapsed,
        "losses": losses,
        "trainable_parameters": trainable,
        "peak_memory_gib": peak_memory_gib(),
        "compiled_graphs": counters["stats"]["unique_graphs"] - graphs_before,
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--impl", choices=["all", "ours", "speculators", "peak"], default="all")
    parser.add_argument("--seq-len", type=int, default=2048)
    parser.add_argument("--ttt-steps", type=int, default=7)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--attention", default="auto", help="ours: eager | flex | auto (flex on GPU)")
    parser.add_argument(
        "--freeze-lm-head", action="store_true", help="speculators' recipe (lm_head not trained)"
    )
    parser.add_argument(
        "--rows-per-rank",
        type=int,
        default=1,
        help="ours: packed rows per GPU per step (global batch = x world)",
    )
    parser.add_argument(
        "--pool",
        type=int,
        default=8,
        help="distinct synthetic rows the steps cycle through (all ranks together)",
    )
    parser.add_argument("--out", default=None, help="write the JSON result here too")
    parser.add_argument("--profile", default=None, help="ours: write a kernel-time table of 3 steps here")
    parser.add_argument("--tiny", action="store_true", help="small shapes: a CPU dry run of the code paths")
    # Their trainer's default loss is a fused Triton kernel; dynamo fails tracing its backward inside
    # their compiled forward on torch 2.11 (AssertionError in triton_kernel_wrap, seen on the H200).
    parser.add_argument("--speculators-loss", choices=["eager", "fused"], default="eager")
    parser.add_argument(
        "--speculators-attention", choices=["simple_flex_attention", "sdpa"], default="simple_flex_attention"
    )
    args = parser.parse_args()
    if args.tiny:
        globals().update(TINY)
    # The key length grows with each TTT step, so attention frames are compiled more than once.
    torch._dynamo.config.recompile_limit = 64
    result = {
        "gpu": torch.cuda.get_device_name() if DEVICE == "cuda" else "cpu",
        "torch": torch.__version__,
        "seq_len": args.seq_len,
        "ttt_steps": args.ttt_steps,
        "steps": args.steps,
        "warmup": args.warmup,
        "rows_per_rank": args.rows_per_rank,
        "freeze_lm_head": args.freeze_lm_head,
        "speculators_attention": args.speculators_attention,
        "speculators_loss": args.speculators_loss,
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
    }
    if args.impl in ("all", "peak") and DEVICE == "cuda":
        result["peak_bf16_tflops"] = peak_matmul_tflops()
    flops = {
        "ours": flops_per_token(
            args.seq_len, args.ttt_steps, lm_head_trained=not args.freeze_lm_head, target_vocab=TARGET_VOCAB
        ),
        "speculators": flops_per_token(
            args.seq_len, args.ttt_steps, lm_head_trained=False, target_vocab=DRAFT_VOCAB
        ),
    }
    if args.impl != "peak":
        device = (
            torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)))
            if DEVICE == "cuda"
            else torch.device("cpu")
        )
        target, counts, batches = synthetic_batches(args.pool, args.seq_len, device)
        for name, run in (("ours", run_ours), ("speculators", run_speculators)):
            if args.impl not in ("all", name):
                continue
            if DEVICE == "cuda":
                torch.cuda.reset_peak_memory_stats()
            try:
                result[name] = run(args, target, counts, batches)
            except Exception as exc:  # noqa: BLE001 - report the other implementation's numbers anyway
                result[name] = {"error": f"{type(exc).__name__}: {str(exc)[:500]}"}
                continue
            result[name]["model_gflop_per_token"] = flops[name] / 1e9
            result[name]["tflops"] = result[name]["tokens_per_second"] * flops[name] / 1e12
            if "peak_bf16_tflops" in result:
                result[name]["mfu"] = result[name]["tflops"] / result["peak_bf16_tflops"]
            print(name, json.dumps(result[name]), flush=True)
            if DEVICE == "cuda":
                torch.cuda.empty_cache()
        if "tokens_per_second" in result.get("ours", {}) and "tokens_per_second" in result.get(
            "speculators", {}
        ):
            result["speedup_ours_over_speculators"] = (
                result["ours"]["tokens_per_second"] / result["speculators"]["tokens_per_second"]
            )
    if int(os.environ.get("RANK", 0)) == 0:
        text = json.dumps(result, indent=1)
        print(text)
        if args.out:
            with open(args.out, "w") as handle:
                handle.write(text)


if __name__ == "__main__":
    main()
