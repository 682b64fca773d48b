"""Measure a draft in vLLM: acceptance from the server's own counters, and speedup over no speculation.

- `counters`: vLLM's `vllm:spec_decode_*` counters and what their deltas mean;
- `rounds`: a prompt set run domain by domain, rounds of one side, ABBA order, pooling;
- `baseline`: how the no-speculation baseline is measured, and its cache;
- `context_lengths`: acceptance on prompts of exactly N tokens, one bucket per context length;
- `evaluations`: where a checkpoint's evaluation is kept, and reading them back;
- `checkpoint`: the evaluation of one checkpoint (what `eagle3 evaluate` runs).
"""
