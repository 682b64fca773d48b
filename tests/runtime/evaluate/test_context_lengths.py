"""Acceptance per context length (`eagle3 evaluate --context-lengths`).

Prompt building runs on the tiny target's own tokenizer and chat template (exact token counts,
BOS kept, the question last, buckets that differ only in how much context precedes it, a bucket
the prompts cannot fill reported as such). The measurement on real vLLM (CPU build) shares the
candidate server of test_baseline.py's adjacent evaluation (a vLLM start costs more than all of
its measurements): two small buckets, two prompts each.
"""

from __future__ import annotations

import pytest

from eagle3_runtime.cli import build_parser
from eagle3_runtime.conversations import load_tokenizer
from eagle3_runtime.evaluate.config import EvaluateConfig
from eagle3_runtime.evaluate.context_lengths import build_buckets, cut_from_front, join_user_runs
from eagle3_runtime.evaluate.evaluations import context_metrics
from eagle3_runtime.pipeline.prompts import write_prompt_sets
from eagle3_runtime.prompt_sources import SourceSpec, load_prompts

K = 3


@pytest.fixture(scope="module")
def eval_prompts(tmp_path_factory):
    """The held-out prompt files (two chat domains, one completion domain), as `eagle3 pipeline` writes them."""
    return write_prompt_sets(tmp_path_factory.mktemp("prompts"), corpus_megabytes=1.0)["eval"]


def _prompts(directory, names: list[str], mode: str):
    per_source, _ = load_prompts(
        [SourceSpec(str(directory / n), mode=mode) for n in names], on_bad_row="fail"
    )
    return [prompt for source in per_source for prompt in source]


@pytest.fixture(scope="module")
def tokenizer(tiny_target):
    return load_tokenizer(str(tiny_target))


def test_chat_buckets_are_exactly_n_tokens_ending_in_the_same_question(eval_prompts, tokenizer):
    prompts = _prompts(eval_prompts, ["chat-complete.jsonl", "chat-continue.jsonl"], "chat")
    short, long = build_buckets(prompts, [100, 300], 3, tokenizer)
    closing = tokenizer("<|end|>\n<|assistant|>\n", add_special_tokens=False)["input_ids"]
    for bucket in (short, long):
        assert bucket.unfilled is None and len(bucket.prompts) == 3
        for ids in bucket.prompts:
            assert len(ids) == bucket.context_length
            assert ids[0] == tokenizer.bos_token_id  # the template's BOS stays first after the cut
            assert ids[-len(closing) :] == closing  # a user turn, then the generation prompt
    # Same questions, more context before them: the short prompt is the long one's tail.
    for small, large in zip(short.prompts, long.prompts, strict=True):
        assert small[1:] == large[-99:]
    # Prompt j ends in the j-th question, taken round-robin over the domains (files here).
    continuing = next(i for i, p in enumerate(prompts) if p.domain == "chat-continue")
    for ids, prompt in zip(long.prompts, [prompts[0], prompts[continuing], prompts[1]], strict=True):
        question = prompt.turns[-1].context[-1]["content"]
        assert question[-40:] in tokenizer.decode(ids, skip_special_tokens=False)


def test_completion_buckets_and_an_unfillable_bucket(eval_prompts, tokenizer):
    prompts = _prompts(eval_prompts, ["completion-code.jsonl"], "completion")
    total = len(tokenizer("\n\n".join(p.text for p in prompts))["input_ids"])
    filled, unfilled = build_buckets(prompts, [200, total + 50], 2, tokenizer)
    assert [len(ids) for ids in filled.prompts] == [200, 200]
    for ids, prompt in zip(filled.prompts, prompts[:2], strict=True):
        # As vLLM's completions endpoint tokenizes the joined texts (this tokenizer adds no BOS).
        assert tokenizer.decode(ids).endswith(prompt.text[-30:])
    # Never silently shorter: the bucket is reported, with how far the prompts reached.
    assert unfilled.prompts == [] and f"fewer than {total + 50}" in unfilled.unfilled


def test_cut_and_join_helpers():
    assert cut_from_front([1, 5, 6, 7, 8], 3, bos_token_id=1) == [1, 7, 8]
    assert cut_from_front([5, 6, 7, 8], 3, bos_token_id=1) == [6, 7, 8]
    assert cut_from_front([1, 5], 3, bos_token_id=1) is None
    joined = join_user_runs(
        [
            {"role": "user", "content": "a"},
            {"role": "user", "content": "b"},
            {"role": "assistant", "content": "c"},
        ]
    )
    assert joined == [{"role": "user", "content": "a\n\nb"}, {"role": "assistant", "content": "c"}]


def _config(**changes) -> EvaluateConfig:
    settings = dict(
        workspace="ws",
        target="t",
        checkpoint="step-1",
        prompts=[],
        num_speculative_tokens=K,
        server=None,
        baseline_server=None,
        baseline="adjacent",
        rounds=1,
        prompts_per_domain=1,
        max_tokens=128,
        concurrency=1,
        max_model_len=1024,
        context_lengths=[256, 512],
    )
    return EvaluateConfig(**(settings | changes))


def test_context_lengths_must_ascend_and_fit_the_served_context():
    assert _config().context_lengths == [256, 512]
    with pytest.raises(ValueError, match="ascending order"):
        _config(context_lengths=[512, 256])
    with pytest.raises(ValueError, match="plus --max-tokens 128 does not fit --max-model-len 1024"):
        _config(context_lengths=[512, 1000])


def test_stage_metrics_list_measured_and_unfilled_lengths():
    contexts = [
        {"context_length": 256, "acceptance_length": 1.5, "drafts": 10.0},
        {"context_length": 512, "acceptance_length": 1.4, "drafts": 12.0},
        {"context_length": 4096, "prompts": 0, "unfilled": "..."},
    ]
    assert context_metrics(contexts) == {
        "context_lengths": [256, 512],
        "context_acceptance_length": [1.5, 1.4],
        "context_drafts": [10.0, 12.0],
        "context_lengths_unfilled": [4096],
    }
    assert context_metrics([]) == {}


def test_evaluation_context_lengths_reach_eagle3_evaluate():
    """The CRD's evaluation.contextLengths are what `eagle3 evaluate`'s own parser reads from the
    planned command; unset, the command asks for none."""
    import yaml

    from eagle3_api import stage_plan
    from eagle3_api.draft_training import DraftTraining
    from tests.api.test_stage_plan_unit import TINY_CPU, _Anywhere

    unset = yaml.safe_load(TINY_CPU.read_text())
    asked = yaml.safe_load(TINY_CPU.read_text())
    asked["spec"]["evaluation"] = {"contextLengths": [256, 512], "contextPrompts": 2}
    for body, expected in ((asked, ([256, 512], 2)), (unset, ([], 4))):
        argv = stage_plan.stage_argv(DraftTraining.model_validate(body), "evaluate", _Anywhere(), step=10)
        args = build_parser(argv).parse_args(argv)
        assert (args.context_lengths, args.context_prompts) == expected
