"""EAGLE-3 training-step throughput on one GPU: ours vs speculators 0.9.0, and MFU.

    python benchmarks/trainer/gpu_step.py --impl all --rounds 3 --out r.json  # peak, then ours and theirs alternating
    torchrun --nproc-per-node 1 benchmarks/trainer/gpu_step.py --impl ours --peak-tflops 790   # FSDP2 path
    # equal global batch: 1 GPU x 2 rows against 2 GPUs x 1 row (compare with loss_curves.py)
    torchrun --nproc-per-node 1 benchmarks/trainer/gpu_step.py --impl ours --rows-per-rank 2 --out a.json
    torchrun --nproc-per-node 2 benchmarks/trainer/gpu_step.py --impl ours --rows-per-rank 1 --out b.json
    # long rows: fewer, longer steps
    python benchmarks/trainer/gpu_step.py --impl all --seq-len 16384 --pool 2 --steps 5 --warmup 2 --rounds 3

Shapes (Llama-3-8B-like target): hidden 4096, 32 heads / 8 KV heads, MLP 14336, target vocab
128256, draft vocab 32000, packed rows of 2048 tokens (one per GPU unless --rows-per-rank), 7 TTT
steps, synthetic target states (a pool of distinct rows; each rank takes its own slice of a
step). Both implementations get the same device-resident batches, bf16 autocast over fp32
master weights, fused AdamW, grad clipping at 1.0; each is warmed up (compiled) first.

One process builds every implementation asked for, warms each up, then runs `--rounds` timed
windows of each, alternating (ours, theirs | theirs, ours | ...), so the two share the GPU's
state of the moment; the result is each one's median over the rounds and the median of the
per-round ratios (speculators' speed moves by about 20 % between processes).

Model FLOPs per token (for MFU) count what the step must compute: the draft's matmuls
forward and backward (weight and input gradients; `fc` has no input gradient), attention
scores and values over the TTT key pattern, and the target head's forward over the rows it
computes: the draft vocabulary's when the rows carry the target's top-1 (as offline shards do;
speculators likewise), the full vocabulary for `ours_full_head` (`--full-head also|only`).
MFU is over the best rate of a bf16 8192^3 matmul measured in the same process, or
`--peak-tflops` where a process does not measure it (torchrun ranks).

A runner that runs out of GPU memory (long rows) is dropped with the error in the result.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import re
import statistics
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch._dynamo.utils import counters

HIDDEN, HEADS, KV_HEADS, HEAD_DIM, MLP = 4096, 32, 8, 128, 14336
TARGET_VOCAB, DRAFT_VOCAB, LAYERS = 128256, 32000, 32
TINY = dict(HIDDEN=64, HEADS=4, KV_HEADS=2, HEAD_DIM=16, MLP=128, TARGET_VOCAB=1000, DRAFT_VOCAB=500)
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
SEQ_LEN = 2048  # --seq-len


def sync() -> None:
    if DEVICE == "cuda":
        torch.cuda.synchronize()


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
        max_position_embeddings=max(8192, SEQ_LEN),
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


def peak_matmul_tflops() -> dict[str, float]:
    """bf16 8192^3 matmul rate on random data, two ways. `best`: the fastest of 20 bursts of
    3 products, each after a 20 ms pause; MFU is taken against it. `sustained`: the median of
    30 back-to-back products after a second of them, which run into the power limit (about 650
    to 680 on the lent H200, below the rate the training step's own matmuls reach, so it would
    overstate MFU)."""
    n = 8192
    a, b = (
        torch.randn(n, n, device="cuda", dtype=torch.bfloat16),
        torch.randn(n, n, device="cuda", dtype=torch.bfloat16),
    )
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)

    def rate(products: int) -> float:
        start.record()
        for _ in range(products):
            a @ b
        end.record()
        torch.cuda.synchronize()
        return products * 2 * n**3 / (start.elapsed_time(end) / 1e3) / 1e12

    rate(50)
    bursts = []
    for _ in range(20):
        time.sleep(0.02)
        bursts.append(rate(3))
    rate(700)
    return {"best": max(bursts), "sustained": statistics.median(rate(1) for _ in range(30))}


def synthetic_batches(count: int, seq_len: int, device):
    """Random target states and a draft vocabulary: the same tensors for both implementations."""
    from eagle3_runtime.target import TargetHead

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
        # What extraction stores with the states: the target's top-1 over its full vocabulary.
        head = TargetHead(target["norm"], target["lm_head"], 1e-5).to(device)
        batches[-1]["top1"] = head(batches[-1]["last"]).argmax(-1)
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


@dataclass
class Runner:
    """One implementation's training step, built and ready to warm up."""

    name: str
    # Queues one optimizer step on a batch; returns a function that waits for it and gives its loss.
    step: Callable[[dict], Callable[[], float]]
    batches: list[dict]
    tokens_per_step: int  # over all ranks
    # As its trainer runs: ours reads step N's numbers after queueing step N+1; speculators'
    # trainer waits for every step (it copies a host scalar to the GPU after the backward).
    pipelined: bool
    facts: dict = field(default_factory=dict)
    losses: list[float] = field(default_factory=list)
    rounds: dict[bool, list[float]] = field(default_factory=lambda: {True: [], False: []})
    resident_bytes: int = 0  # GPU memory it holds between steps (weights, optimizer state, caches)
    peak_bytes: int = 0

    def run(self, steps: int, pipelined: bool | None = None) -> float:
        """`steps` steps in order through the batches; returns the seconds they took."""
        pipelined = self.pipelined if pipelined is None else pipelined
        sync()
        started = time.perf_counter()
        pending = None
        for _ in range(steps):
            launched = self.step(self.batches[len(self.losses) % len(self.batches)])
            if pending is not None:
                self.losses.append(pending())
            pending = launched
            if not pipelined:
                self.losses.append(pending())
                pending = None
        if pending is not None:
            self.losses.append(pending())
        sync()
        return time.perf_counter() - started


def out_of_memory(runner: Runner, runners: list[Runner], failed: dict[str, str], error: Exception) -> None:
    """Drops a runner that ran out of GPU memory (long rows): the others go on without its weights."""
    failed[runner.name] = f"out of GPU memory: {str(error).splitlines()[0][:300]}"
    print(f"{runner.name}: {failed[runner.name]}")
    runners.remove(runner)
    torch.cuda.empty_cache()


def measure(runners: list[Runner], args) -> dict[str, str]:
    """Warm up (compile) each runner, then time `args.rounds` alternating windows of each (and
    of each in the other mode, with --both-modes). Returns the runners dropped for running out
    of memory (removed from `runners`), with the error."""
    failed: dict[str, str] = {}
    for runner in list(runners):
        graphs_before = counters["stats"]["unique_graphs"]
        allocated_before = torch.cuda.memory_allocated() if DEVICE == "cuda" else 0
        try:
            runner.run(args.warmup)
        except torch.OutOfMemoryError as error:
            out_of_memory(runner, runners, failed, error)
            continue
        runner.facts["compiled_graphs"] = counters["stats"]["unique_graphs"] - graphs_before
        if DEVICE == "cuda":
            runner.resident_bytes += torch.cuda.memory_allocated() - allocated_before
    windows = [(r, r.pipelined) for r in runners]
    if args.both_modes:
        windows += [(r, not r.pipelined) for r in runners]
    for round_index in range(args.rounds):
        for runner, pipelined in windows if round_index % 2 == 0 else windows[::-1]:
            if runner not in runners:
                continue
            others = sum(r.resident_bytes for r in runners if r is not runner)
            if DEVICE == "cuda":
                torch.cuda.reset_peak_memory_stats()
            try:
                elapsed = runner.run(args.steps, pipelined)
            except torch.OutOfMemoryError as error:
                out_of_memory(runner, runners, failed, error)
                continue
            runner.rounds[pipelined].append(args.steps * runner.tokens_per_step / elapsed)
            if DEVICE == "cuda":
                runner.peak_bytes = max(runner.peak_bytes, torch.cuda.max_memory_allocated() - others)
            mode = "pipelined" if pipelined else "waiting every step"
            print(
                f"round {round_index + 1} {runner.name} ({mode}): {runner.rounds[pipelined][-1]:,.0f} tokens/s, "
                f"peak memory {runner.peak_bytes / 2**30:.1f} GiB"
            )
    return failed


def kernel_categories(kernels: dict[str, float]) -> dict[str, float]:
    """Kernel time grouped by what it does (names of cuBLAS, FlexAttention, inductor, AdamW...)."""
    patterns = [
        ("matmul", r"gemm|nvjet|cutlass|xmma|cublas|sm90_|sm80_"),
        ("flex_attention", r"flex|triton_tem"),
        ("adamw", r"adam"),
        ("foreach (grad clipping)", r"foreach|multi_tensor"),
        ("inductor fused pointwise/reduction", r"^triton_"),
        ("copies and eager elementwise", r"copy|elementwise|cat|fill|index"),
    ]
    totals = dict.fromkeys([name for name, _ in patterns] + ["other"], 0.0)
    for kernel, seconds in kernels.items():
        name = next((n for n, p in patterns if re.search(p, kernel, re.IGNORECASE)), "other")
        totals[name] += seconds
    return totals


def profile_steps(runner: Runner, path: str, steps: int = 3) -> dict:
    """Where a step's GPU time goes: every kernel of `steps` profiled steps (JSON at `path`),
    grouped by category; the GPU's idle time between kernels, and its longest idle gaps."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        wall = runner.run(steps)
    kernels = [
        e
        for e in prof.events()
        if e.device_type == DeviceType.CUDA and not getattr(e, "is_user_annotation", False)
    ]
    totals: dict[str, list[float]] = {}  # name -> [milliseconds per step, launches per step]
    for event in kernels:
        entry = totals.setdefault(event.name, [0.0, 0.0])
        entry[0] += (event.time_range.end - event.time_range.start) / 1e3 / steps
        entry[1] += 1 / steps
    kernels.sort(key=lambda e: e.time_range.start)
    gaps, busy_until, previous = [], None, None
    for event in kernels:
        if busy_until is not None and event.time_range.start > busy_until:
            gaps.append((event.time_range.start - busy_until, previous.name, event.name))
        if busy_until is None or event.time_range.end > busy_until:
            busy_until, previous = event.time_range.end, event
    gaps.sort(reverse=True)
    summary = {
        "wall_ms_per_step": 1e3 * wall / steps,
        "kernel_ms_per_step": sum(v[0] for v in totals.values()),
        "idle_ms_per_step": sum(g[0] for g in gaps) / 1e3 / steps,
        "categories_ms_per_step": {
            k: round(1e3 * v, 3)
            for k, v in kernel_categories({n: v[0] / 1e3 for n, v in totals.items()}).items()
        },
        "longest_idle_gaps_ms": [
            [round(g / 1e3, 3), before[:80], after[:80]] for g, before, after in gaps[:12]
        ],
    }
    top = sorted(totals.items(), key=lambda kv: -kv[1][0])
    with open(path, "w") as handle:
        kernel_table = {k: [round(v[0], 4), round(v[1], 2)] for k, v in top}
        json.dump({**summary, "kernels_ms_and_launches_per_step": kernel_table}, handle, indent=1)
    return summary


def head_costs(target, counts, last: torch.Tensor, repeats: int = 20) -> dict[str, float]:
    """Milliseconds of the target-head work per 2048-token row, three ways: the full-vocabulary
    logits with the top-1 and the draft-vocabulary restriction (what `ttt_loss` reads); the
    draft-vocabulary rows plus the max over the other rows (the same mask, no full logits
    tensor); the draft-vocabulary rows alone (speculators: no out-of-vocabulary mask)."""
    from eagle3_runtime.model.vocab import build_draft_vocab

    vocab = build_draft_vocab(counts, DRAFT_VOCAB)
    weight = target["lm_head"].to(last.device)
    used = vocab.used_ids.to(last.device)
    rest = (~vocab.t2d).nonzero().squeeze(1).to(last.device)
    draft_rows, other_rows = weight[used].contiguous(), weight[rest].contiguous()
    x = torch.nn.functional.rms_norm(last.float(), (HIDDEN,), eps=1e-5).to(torch.bfloat16)

    def full():
        logits = torch.nn.functional.linear(x, weight)
        return logits.argmax(-1), torch.log_softmax(logits.index_select(-1, used).float(), -1)

    def split():
        logits = torch.nn.functional.linear(x, draft_rows)
        best_in, best_out = logits.amax(-1), torch.nn.functional.linear(x, other_rows).amax(-1)
        return best_in >= best_out, torch.log_softmax(logits.float(), -1)

    def draft_only():
        return torch.log_softmax(torch.nn.functional.linear(x, draft_rows).float(), -1)

    result = {}
    for name, fn in (
        ("full_vocabulary", full),
        ("draft_rows_plus_other_max", split),
        ("draft_rows_only", draft_only),
    ):
        fn()
        sync()
        started = time.perf_counter()
        for _ in range(repeats):
            fn()
        sync()
        result[name] = round(1e3 * (time.perf_counter() - started) / repeats, 3)
    return result


def build_ours(args, target, counts, batches, *, stored_top1: bool = True) -> Runner:
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
        loss_chunk_rows=args.loss_chunk_rows,
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
    # As `DraftTrainer._batch` does: the draft vocabulary's rows of the head when the data carries
    # the target's top-1, else the full head (its argmax gives the out-of-vocabulary mask).
    head = trainer.draft_target_head if stored_top1 else trainer.target_head
    seq = args.seq_len

    def step(b):
        batch = TTTBatch(
            input_ids=b["input_ids"],
            aux_hidden_states=b["aux"],
            target_logits=head(b["last"]),
            predict_mask=b["loss_mask"],
            document_ids=torch.zeros_like(b["input_ids"]),
            positions=torch.arange(seq, device=b["input_ids"].device).expand_as(b["input_ids"]),
            target_top1=b["top1"] if stored_top1 else None,
        )
        launched = trainer.launch(batch, b["input_ids"].numel())
        return lambda: launched.summary()["loss"]

    facts = {
        "world_size": context.world_size,
        "rows_per_rank": args.rows_per_rank,
        "stored_top1": stored_top1,
    }
    tokens = seq * args.rows_per_rank * context.world_size
    name = "ours" if stored_top1 else "ours_full_head"
    return Runner(name, step, batches, tokens, pipelined=True, facts=facts)


def build_ours_full_head(args, target, counts, batches) -> Runner:
    return build_ours(args, target, counts, batches, stored_top1=False)


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


def build_speculators(args, target, counts, batches) -> Runner:
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
        loss = loss.detach()
        return loss.item

    trainable = sum(p.numel() for p in params)
    return Runner(
        "speculators", step, batches, seq, pipelined=False, facts={"trainable_parameters": trainable}
    )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--impl", choices=["all", "ours", "speculators", "peak"], default="all")
    parser.add_argument(
        "--full-head",
        choices=["no", "also", "only"],
        default="no",
        help="ours without the stored top-1 (the full target head each step): also, or instead",
    )
    parser.add_argument("--seq-len", type=int, default=2048)
    parser.add_argument("--ttt-steps", type=int, default=7)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--attention", default="auto", help="ours: eager | flex | auto (flex on GPU)")
    parser.add_argument(
        "--freeze-lm-head", action="store_true", help="speculators' recipe (lm_head not trained)"
    )
    parser.add_argument(
        "--loss-chunk-rows",
        type=int,
        default=None,
        help="ours: lm_head and the KL this many rows at a time (TrainSettings.loss_chunk_rows)",
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
    parser.add_argument(
        "--rounds", type=int, default=3, help="timed windows of each implementation, alternating"
    )
    parser.add_argument(
        "--both-modes",
        action="store_true",
        help="also time each implementation in the other mode (pipelined or not)",
    )
    parser.add_argument(
        "--peak-tflops", type=float, default=None, help="MFU against this instead of measuring"
    )
    parser.add_argument("--out", default=None, help="write the JSON result here too")
    parser.add_argument(
        "--profile", default=None, help="write each implementation's kernel times to PREFIX-NAME.json"
    )
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
    globals()["SEQ_LEN"] = args.seq_len
    # The key length grows with each TTT step, so attention frames are compiled more than once.
    torch._dynamo.config.recompile_limit = 64
    result = {
        "gpu": torch.cuda.get_device_name() if DEVICE == "cuda" else "cpu",
        "torch": torch.__version__,
        "seq_len": args.seq_len,
        "ttt_steps": args.ttt_steps,
        "steps": args.steps,
        "warmup": args.warmup,
        "rounds": args.rounds,
        "rows_per_rank": args.rows_per_rank,
        "freeze_lm_head": args.freeze_lm_head,
        "loss_chunk_rows": args.loss_chunk_rows,
        "full_head": args.full_head,
        "speculators_attention": args.speculators_attention,
        "speculators_loss": args.speculators_loss,
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
    }
    if args.peak_tflops is not None:
        result["peak_bf16_tflops"] = args.peak_tflops
    elif args.impl in ("all", "peak") and DEVICE == "cuda":
        peak = peak_matmul_tflops()
        result["peak_bf16_tflops"], result["sustained_bf16_tflops"] = peak["best"], peak["sustained"]
    flops = {
        # With the stored top-1 ours computes the head's draft-vocabulary rows only, as speculators does.
        "ours": flops_per_token(
            args.seq_len, args.ttt_steps, lm_head_trained=not args.freeze_lm_head, target_vocab=DRAFT_VOCAB
        ),
        "ours_full_head": flops_per_token(
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
        # Counted in every runner's peak memory (allocated before any of them).
        result["input_pool_gib"] = sum(t.nbytes for b in batches for t in b.values()) / 2**30
        if args.impl == "all" and DEVICE == "cuda":
            result["target_head_ms"] = head_costs(target, counts, batches[0]["last"][0])
        runners = []
        builds = (
            ("ours", build_ours, args.full_head != "only"),
            ("ours_full_head", build_ours_full_head, args.full_head != "no"),
            ("speculators", build_speculators, True),
        )
        for name, build, wanted in builds:
            if wanted and args.impl in ("all", name.removesuffix("_full_head")):
                allocated_before = torch.cuda.memory_allocated() if DEVICE == "cuda" else 0
                try:
                    runners.append(build(args, target, counts, batches))
                except Exception as exc:  # noqa: BLE001 - report the other implementation's numbers anyway
                    result[name] = {"error": f"{type(exc).__name__}: {str(exc)[:500]}"}
                    continue
                if DEVICE == "cuda":  # its weights: another's peak must not count them
                    runners[-1].resident_bytes = torch.cuda.memory_allocated() - allocated_before
        for name, error in measure(runners, args).items():
            result[name] = {"error": error}
        for runner in runners:
            tokens_per_second = statistics.median(runner.rounds[runner.pipelined])
            result[runner.name] = {
                "tokens_per_second": tokens_per_second,
                "tokens_per_second_rounds": runner.rounds[runner.pipelined],
                "pipelined": runner.pipelined,
                "model_gflop_per_token": flops[runner.name] / 1e9,
                "tflops": tokens_per_second * flops[runner.name] / 1e12,
                "peak_memory_gib": runner.peak_bytes / 2**30,
                "losses": runner.losses,
                **runner.facts,
            }
            if "peak_bf16_tflops" in result:
                result[runner.name]["mfu"] = result[runner.name]["tflops"] / result["peak_bf16_tflops"]
            if runner.rounds[not runner.pipelined]:
                result[runner.name]["other_mode_tokens_per_second_rounds"] = runner.rounds[
                    not runner.pipelined
                ]
            if args.profile and DEVICE == "cuda":
                try:
                    result[runner.name]["profile"] = profile_steps(
                        runner, f"{args.profile}-{runner.name}.json"
                    )
                except Exception as exc:  # noqa: BLE001 - keep the measurement when the profiler fails
                    result[runner.name]["profile"] = {"error": f"{type(exc).__name__}: {exc}"}
        by_name = {runner.name: runner for runner in runners}
        theirs = by_name.get("speculators")
        for name in ("ours", "ours_full_head"):
            if theirs is None or name not in by_name:
                continue
            ours = by_name[name]
            ours_rounds, their_rounds = ours.rounds[ours.pipelined], theirs.rounds[theirs.pipelined]
            ratios = [a / b for a, b in zip(ours_rounds, their_rounds, strict=True)]
            suffix = name.removeprefix("ours")
            result[f"speedup_per_round{suffix}"] = ratios
            result[f"speedup{suffix}_ours_over_speculators"] = statistics.median(ratios)
    if int(os.environ.get("RANK", 0)) == 0:
        text = json.dumps(result, indent=1)
        print(text)
        if args.out:
            with open(args.out, "w") as handle:
                handle.write(text)


if __name__ == "__main__":
    main()
