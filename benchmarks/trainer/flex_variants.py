"""FlexAttention forward + backward at the draft's attention shape, one kernel configuration per
line: which block sizes the trainer's TTT attention should compile with on this GPU.

    python benchmarks/trainer/flex_variants.py --seq-len 16384 --out flex.json

Shape: one packed row, 32 query heads over 8 KV heads, head dim 128, bf16, the document-causal
block mask of `eagle3_runtime.model.attention` (one document), the log-sum-exp returned and
given a gradient (as the TTT merge of the diagonal keys needs). Each variant is compiled on its
own; `autotune` lets inductor's max-autotune choose (its picks go to stderr). TFLOP/s count the
causal half: forward 4 T^2/2 H D, backward 2.5x that.
"""

from __future__ import annotations

import argparse
import json
import statistics

import torch
from torch.nn.attention.flex_attention import AuxRequest, flex_attention

from eagle3_runtime.model.attention import _document_causal_block_mask

HEADS, KV_HEADS, HEAD_DIM = 32, 8, 128

VARIANTS: dict[str, dict] = {
    "default": {},
    "tma": {"USE_TMA": True},
    "fwd_128x128_s2": {"fwd_BLOCK_M": 128, "fwd_BLOCK_N": 128, "fwd_num_stages": 2, "fwd_num_warps": 8},
    "bwd_64x128_s2": {
        "bwd_BLOCK_M1": 64,
        "bwd_BLOCK_N1": 128,
        "bwd_BLOCK_M2": 128,
        "bwd_BLOCK_N2": 64,
        "bwd_num_stages": 2,
        "bwd_num_warps": 8,
    },
    "bwd_32x128_s3_w4": {
        "bwd_BLOCK_M1": 32,
        "bwd_BLOCK_N1": 128,
        "bwd_BLOCK_M2": 128,
        "bwd_BLOCK_N2": 32,
        "bwd_num_stages": 3,
        "bwd_num_warps": 4,
    },
    "autotune": {},
}


def time_ms(fn, repeats: int = 10) -> float:
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(repeats):
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seq-len", type=int, default=16384)
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    t = args.seq_len
    g = torch.Generator(device="cuda").manual_seed(0)

    def rand(*shape):
        return torch.randn(*shape, device="cuda", dtype=torch.bfloat16, generator=g)

    q, k, v = rand(1, HEADS, t, HEAD_DIM), rand(1, KV_HEADS, t, HEAD_DIM), rand(1, KV_HEADS, t, HEAD_DIM)
    for x in (q, k, v):
        x.requires_grad_(True)
    grad_out, grad_lse = rand(1, HEADS, t, HEAD_DIM), rand(1, HEADS, t).float()
    block_mask = _document_causal_block_mask(torch.zeros(1, t, dtype=torch.int64, device="cuda"))
    forward_flop = 4 * t * t / 2 * HEADS * HEAD_DIM
    results = {"seq_len": t, "gpu": torch.cuda.get_device_name(), "torch": torch.__version__}
    for name in args.variants.split(","):
        options = VARIANTS[name]
        mode = "max-autotune-no-cudagraphs" if name == "autotune" else None

        def attend(q, k, v, options=options):
            return flex_attention(
                q,
                k,
                v,
                block_mask=block_mask,
                enable_gqa=True,
                return_aux=AuxRequest(lse=True),
                kernel_options=options or None,
            )

        compiled = torch.compile(attend, dynamic=False, mode=mode)

        def forward(compiled=compiled):
            with torch.no_grad():
                compiled(q, k, v)

        def forward_backward(compiled=compiled):
            out, aux = compiled(q, k, v)
            torch.autograd.backward([out, aux.lse], [grad_out, grad_lse])

        try:
            forward_backward()
            forward()
            fwd, both = time_ms(forward), time_ms(forward_backward)
        except Exception as exc:  # noqa: BLE001 - a configuration the GPU refuses is a result too
            results[name] = {"error": f"{type(exc).__name__}: {str(exc)[:300]}"}
            print(name, results[name])
            continue
        bwd = both - fwd
        results[name] = {
            "forward_ms": fwd,
            "backward_ms": bwd,
            "forward_tflops": forward_flop / fwd / 1e9,
            "backward_tflops": 2.5 * forward_flop / bwd / 1e9,
            "options": options,
        }
        print(
            f"{name:>20}: fwd {fwd:7.2f} ms ({results[name]['forward_tflops']:5.0f} TFLOP/s)  "
            f"bwd {bwd:7.2f} ms ({results[name]['backward_tflops']:5.0f} TFLOP/s)",
            flush=True,
        )
        if args.out:  # after every variant: a run cut short keeps what it measured
            with open(args.out, "w") as handle:
                json.dump(results, handle, indent=1)


if __name__ == "__main__":
    main()
