"""The tiny preset's prompt sets: evaluation prompts are held out from training, whatever the seed."""

from __future__ import annotations

import json

from eagle3_runtime.pipeline.prompts import DOMAINS, INSTRUCTIONS, write_prompt_sets


def _prompts(directory) -> dict[str, list[str]]:
    return {
        domain: [
            json.loads(line)["prompt"] for line in (directory / f"{domain}.jsonl").read_text().splitlines()
        ]
        for domain in DOMAINS
    }


def test_no_evaluation_prompt_was_seen_in_training(tmp_path):
    sets = {
        seed: write_prompt_sets(tmp_path / f"seed{seed}", seed=seed, corpus_megabytes=2.0) for seed in (0, 1)
    }
    evaluation = _prompts(sets[0]["eval"])
    training = [p for seed in (0, 1) for prompts in _prompts(sets[seed]["train"]).values() for p in prompts]
    for domain, prompts in evaluation.items():
        assert len(prompts) >= 8, f"{domain}: only {len(prompts)} evaluation prompts"
        assert len(set(prompts)) == len(prompts), f"{domain}: repeated evaluation prompts"
        codes = [p.removeprefix(INSTRUCTIONS[domain]) for p in prompts]
        leaked = [code for code in codes if any(code in seen for seen in training)]
        assert not leaked, (
            f"{domain}: {len(leaked)} evaluation prompts occur in training prompts: {leaked[:3]}"
        )


def test_the_training_prompts_are_a_pure_function_of_the_seed(tmp_path):
    # A resumed `generate` checks its input files have not moved.
    first = write_prompt_sets(tmp_path / "a", seed=3, corpus_megabytes=1.0)["train"]
    second = write_prompt_sets(tmp_path / "b", seed=3, corpus_megabytes=1.0)["train"]
    for domain in DOMAINS:
        assert (first / f"{domain}.jsonl").read_bytes() == (second / f"{domain}.jsonl").read_bytes()
