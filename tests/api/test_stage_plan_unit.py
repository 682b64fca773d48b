"""stage_plan: the one translation of a DraftTraining into stages and commands (operator and
`eagle3 pipeline` alike). That both sides run the same commands is tested with the operator's
Jobs in tests/operator/test_pod_commands_unit.py."""

from __future__ import annotations

import pytest
import yaml

from eagle3_api import stage_plan
from eagle3_api.draft_training import DraftTraining
from tests.support.cluster import REPO_ROOT

TINY_CPU = REPO_ROOT / "examples" / "drafttraining-tiny-cpu.yaml"


def _training(**spec) -> DraftTraining:
    body = yaml.safe_load(TINY_CPU.read_text())
    body["spec"] |= spec
    return DraftTraining.model_validate(body)


def test_tiny_cpu_evaluates_its_first_and_last_checkpoint():
    """The operator evaluated {150, 180} of the tiny-cpu training, the local pipeline {30, 180}
    before both followed one rule: the first, every Nth after it, and the last."""
    training = _training()
    checkpoints = [str(step) for step in range(60, 361, 60)]
    assert stage_plan.checkpoints_to_evaluate(training, {"checkpoints": checkpoints}) == [60, 360]


@pytest.mark.parametrize(
    ("checkpoints", "every", "chosen"),
    [
        ([5, 10, 15, 20], 2, [5, 15, 20]),
        ([5, 10, 15], 1, [5, 10, 15]),
        ([7], 3, [7]),
        ([20, 10], 5, [10, 20]),
    ],
)
def test_checkpoints_to_evaluate_takes_the_first_every_nth_after_it_and_the_last(checkpoints, every, chosen):
    training = _training(evaluation={"everyCheckpoints": every})
    metrics = {"checkpoints": [str(s) for s in checkpoints], "step": checkpoints[-1]}
    assert stage_plan.checkpoints_to_evaluate(training, metrics) == chosen


def test_a_training_without_checkpoints_cannot_be_evaluated():
    assert stage_plan.checkpoints_to_evaluate(_training(), {"step": 40}) == [40]  # older trainers
    with pytest.raises(stage_plan.StageInputError, match="reported no checkpoints"):
        stage_plan.checkpoints_to_evaluate(_training(), {})


@pytest.mark.parametrize(
    ("mode", "quantize", "stages"),
    [
        ("offline", "none", ["generate", "extract", "train", "evaluate", "select", "export"]),
        ("online", "none", ["generate", "train", "evaluate", "select", "export"]),
        ("streaming", "fp8", ["generate", "train", "evaluate", "select", "export", "quantize"]),
    ],
)
def test_stage_order(mode, quantize, stages):
    training = _training(hiddenStates={"mode": mode}, export={"quantize": quantize})
    assert stage_plan.stages(training) == stages
    servers = {stage: stage_plan.server_for(training, stage) for stage in stages}
    assert servers["generate"] == "target"
    assert servers["train"] == ("stream" if mode == "streaming" else None)


def test_a_stage_that_talks_to_a_server_needs_its_url():
    training = _training(hiddenStates={"mode": "streaming"})
    with pytest.raises(stage_plan.StageInputError, match="train needs the URL of the stream server"):
        stage_plan.stage_argv(training, "train", _Anywhere())
    with pytest.raises(stage_plan.StageInputError, match="evaluate needs the checkpoint's step"):
        stage_plan.stage_argv(training, "evaluate", _Anywhere())


class _Anywhere:
    """Locations where everything is under /x (enough for the checks that need none)."""

    workspace = "/x/workspace"

    def model(self, ref: str, role: str) -> str:
        return f"/x/{role}"

    def dataset(self, claim: str, path: str) -> str:
        return f"/x/{claim}/{path}"

    def output(self, claim: str, path: str) -> str:
        return f"/x/{claim}/{path}"


def test_data_generation_settings_reach_eagle3_generate():
    """The CRD's data-generation settings (multi-turn, template arguments, tools, long samples) are
    what `eagle3 generate`'s own parser reads from the planned command."""
    import argparse

    from eagle3_runtime.stages import generate

    body = yaml.safe_load(TINY_CPU.read_text())
    body["spec"]["data"] |= {
        "regenerateTurns": "last",
        "chatTemplateKwargs": {"enable_thinking": True, "reasoning_effort": "low"},
        "maxLength": 4096,
        "longSamples": "skip",
    }
    body["spec"]["data"]["sources"][0]["toolsField"] = "functions"
    training = DraftTraining.model_validate(body)
    argv = stage_plan.stage_argv(training, "generate", _Anywhere(), server="http://target:8000")

    parser = argparse.ArgumentParser()
    generate.add_arguments(parser)
    args = parser.parse_args(argv[1:])
    assert args.regenerate_turns == "last"
    assert args.chat_template_kwargs == {"enable_thinking": True, "reasoning_effort": "low"}
    assert (args.max_length, args.long_samples) == (4096, "skip")
    assert [s.tools_field for s in args.source] == ["functions"] + ["tools"] * (len(args.source) - 1)

    defaults = parser.parse_args(
        stage_plan.stage_argv(_training(), "generate", _Anywhere(), server="http://t")[1:]
    )
    assert (defaults.regenerate_turns, defaults.chat_template_kwargs) == ("all", None)
    assert (defaults.max_length, defaults.long_samples) == (2047, "truncate")


def test_extraction_reads_the_samples_as_long_as_generate_kept_them():
    """Long samples (data.maxLength 8192) are extracted whole, not cut at the extract stage's
    default of 2047 tokens."""
    training = _training(data={**_training().spec.data.model_dump(by_alias=True), "maxLength": 8192})
    offline = stage_plan.stage_argv(training, "extract", _Anywhere())
    streaming = stage_plan.stream_server_argv(training, _Anywhere(), 8000, 5600)
    assert [argv[argv.index("--max-length") + 1] for argv in (offline, streaming)] == ["8192", "8192"]


@pytest.mark.parametrize("mode", ["offline", "streaming"])
def test_every_stage_that_reads_the_target_reads_its_pinned_revision(mode):
    """target.revision reaches the vLLM servers as --revision (reconcile/pods.py) and, as
    --target-revision, every stage that reads the target's files itself or records the data's target;
    each stage's own parser reads it."""
    import argparse
    import importlib

    training = _training(
        target={"model": "acme/tiny", "revision": "v2"},
        hiddenStates={"mode": mode},
        evaluation={"sweep": {"maxSpeculativeTokens": 2}},
    )
    commands = {
        "generate": stage_plan.stage_argv(training, "generate", _Anywhere(), server="http://t"),
        "train": stage_plan.stage_argv(training, "train", _Anywhere(), server="http://s"),
        "evaluate": stage_plan.stage_argv(training, "evaluate", _Anywhere(), step=4),
        "sweep": stage_plan.stage_argv(training, "sweep", _Anywhere()),
    }
    if mode == "offline":
        commands["extract"] = stage_plan.stage_argv(training, "extract", _Anywhere())
    else:
        commands["extract"] = stage_plan.stream_server_argv(training, _Anywhere(), 8000, 5600)
    for stage, argv in commands.items():
        parser = argparse.ArgumentParser()
        importlib.import_module(f"eagle3_runtime.stages.{stage}").add_arguments(parser)
        assert parser.parse_args(argv[1:]).target_revision == "v2", (stage, argv)

    unpinned = stage_plan.stage_argv(_training(), "train", _Anywhere())
    assert "--target-revision" not in unpinned


def test_extract_evaluate_and_sweep_serve_the_target_as_its_server_does():
    """The vLLM servers that extract (both modes), evaluate and sweep start get the target's tensor parallelism,
    quantization, attention backend and extraArgs (an 8-GPU target started with TP 1 would not fit);
    each stage's own parser reads them back in order. No --revision: they pin it themselves."""
    import argparse
    import importlib

    training = _training(
        target={
            "model": "acme/big",
            "revision": "v2",
            "tensorParallelSize": 8,
            "quantization": "fp8",
            "attentionBackend": "ROCM_AITER_FA",
            "extraArgs": ["--max-num-seqs", "64"],
        },
        evaluation={"sweep": {"maxSpeculativeTokens": 2}},
    )
    served = [
        "--tensor-parallel-size",
        "8",
        "--quantization",
        "quark",
        "--attention-backend",
        "ROCM_AITER_FA",
        "--max-num-seqs",
        "64",
    ]
    for stage, argv in [
        ("extract", stage_plan.stage_argv(training, "extract", _Anywhere())),
        ("extract", stage_plan.stream_server_argv(training, _Anywhere(), 8000, 5600)),
        ("evaluate", stage_plan.stage_argv(training, "evaluate", _Anywhere(), step=4)),
        ("sweep", stage_plan.stage_argv(training, "sweep", _Anywhere())),
    ]:
        parser = argparse.ArgumentParser()
        importlib.import_module(f"eagle3_runtime.stages.{stage}").add_arguments(parser)
        assert parser.parse_args(argv[1:]).vllm_arg == served, (stage, argv)
