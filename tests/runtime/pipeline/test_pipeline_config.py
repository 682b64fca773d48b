"""`eagle3 pipeline --config`: a DraftTraining manifest, validated by the operator's models, whose
claims map to local folders; the stage commands are stage_plan's."""

from __future__ import annotations

import pytest
import yaml

from eagle3_runtime.pipeline.config import load_config, parse_volumes
from eagle3_runtime.pipeline.runner import PipelineRunner

MANIFEST = {
    "apiVersion": "eagle3.ai/v1alpha1",
    "kind": "DraftTraining",
    "metadata": {"name": "tiny"},
    "spec": {
        "target": {"model": "pvc://models/tiny", "maxModelLen": 512},
        "data": {
            "sources": [
                {
                    "claimName": "prompts",
                    "path": "chat.jsonl",
                    "mode": "chat",
                    "messagesField": "conversations",
                },
                {"claimName": "prompts", "path": "raw.jsonl", "mode": "completion", "weight": 0.5},
            ],
            "numSamples": 64,
            "temperature": 0,
        },
        "hiddenStates": {"mode": "streaming", "layerIds": [1, 2, 3]},
        "draft": {"vocabSize": 1024},
        "training": {"steps": 10, "checkpointEvery": 5, "tttSteps": 2, "seqLen": 256, "lossChunkRows": 96},
        "evaluation": {
            "everyCheckpoints": 2,
            "prompts": [{"claimName": "prompts", "path": "eval.jsonl", "mode": "completion"}],
            "promptsPerDomain": 4,
        },
    },
}


@pytest.fixture
def volumes(tmp_path):
    (tmp_path / "vol-models" / "tiny").mkdir(parents=True)
    prompts = tmp_path / "vol-prompts"
    prompts.mkdir()
    for name in ("chat.jsonl", "raw.jsonl", "eval.jsonl"):
        (prompts / name).write_text('{"prompt": "x"}\n')
    return parse_volumes([f"models={tmp_path / 'vol-models'}", f"prompts={prompts}"])


def _write(tmp_path, manifest) -> str:
    path = tmp_path / "training.yaml"
    path.write_text(yaml.safe_dump(manifest))
    return path


def _flag(argv: list[str], flag: str) -> str | None:
    return argv[argv.index(flag) + 1] if flag in argv else None


def _runner(tmp_path, volumes, manifest=MANIFEST) -> PipelineRunner:
    return PipelineRunner(load_config(_write(tmp_path, manifest), volumes), tmp_path / "ws")


def test_manifest_maps_to_local_paths_and_settings(tmp_path, volumes):
    runner = _runner(tmp_path, volumes)
    prompts = volumes["prompts"].resolve()
    generate = runner.argv("generate", server="http://127.0.0.1:8123")
    assert [v for f, v in zip(generate, generate[1:], strict=False) if f == "--source"] == [
        f"{prompts / 'chat.jsonl'},mode=chat,weight=1,messages-field=conversations",
        f"{prompts / 'raw.jsonl'},mode=completion,weight=0.5",
    ]
    assert (_flag(generate, "--workspace"), _flag(generate, "--server")) == (
        str(tmp_path / "ws"),
        "http://127.0.0.1:8123",
    )
    # The target server serves the model under the name the cluster's does.
    assert (_flag(generate, "--model"), _flag(generate, "--temperature")) == ("pvc://models/tiny", "0")
    train = runner.argv("train", server="http://127.0.0.1:8124")
    assert _flag(train, "--target") == str((tmp_path / "vol-models" / "tiny").resolve())
    assert (_flag(train, "--hidden-states"), _flag(train, "--layer-ids"), _flag(train, "--server")) == (
        "streaming",
        "1,2,3",
        "http://127.0.0.1:8124",
    )
    flags = ("--steps", "--checkpoint-every", "--ttt-steps", "--seq-len", "--loss-chunk-rows")
    assert [_flag(train, f) for f in flags] == ["10", "5", "2", "256", "96"]
    evaluate = runner.argv("evaluate", step=5)
    assert _flag(evaluate, "--prompts") == f"{prompts / 'eval.jsonl'},mode=completion"
    assert [_flag(evaluate, f) for f in ("--checkpoint", "--prompts-per-domain", "--max-model-len")] == [
        "step-00000005",
        "4",
        "512",
    ]


def test_invalid_manifest_is_refused_with_the_field(tmp_path, volumes):
    bad = yaml.safe_load(yaml.safe_dump(MANIFEST))
    bad["spec"]["training"]["tttSteps"] = 0
    with pytest.raises(ValueError, match=r"(?s)not a valid DraftTraining spec.*tttSteps"):
        load_config(_write(tmp_path, bad), volumes)


def test_the_old_local_section_is_refused_with_where_its_settings_went(tmp_path, volumes):
    old = {**MANIFEST, "local": {"eval_prompts_per_domain": 4}}
    with pytest.raises(ValueError, match=r"`local` section is gone.*evaluation.promptsPerDomain"):
        load_config(_write(tmp_path, old), volumes)


def test_missing_volume_path_is_named(tmp_path):
    with pytest.raises(FileNotFoundError, match="--volume prompts=DIR"):
        load_config(_write(tmp_path, MANIFEST), {"models": tmp_path / "vol-models"})


def test_epochs_draft_layers_and_warm_start_reach_the_local_run(tmp_path, volumes):
    head = volumes["models"] / "eagle3-head"
    head.mkdir()
    manifest = yaml.safe_load(yaml.safe_dump(MANIFEST))
    manifest["spec"]["hiddenStates"] = {"mode": "offline"}
    manifest["spec"]["training"] = {"epochs": 3}
    manifest["spec"]["draft"] = {
        "layers": 2,
        "initialization": {"from": "checkpoint", "path": "pvc://models/eagle3-head"},
    }
    train = _runner(tmp_path, volumes, manifest).argv("train")
    assert [_flag(train, f) for f in ("--steps", "--epochs", "--draft-layers")] == [None, "3", "2"]
    assert _flag(train, "--init-checkpoint") == str(head.resolve())
    manifest["spec"]["training"] = {}
    manifest["spec"]["draft"] = {}
    train = _runner(tmp_path, volumes, manifest).argv("train")
    assert [_flag(train, f) for f in ("--steps", "--epochs", "--draft-layers")] == ["2000", None, "1"]
    assert "--init-checkpoint" not in train
    manifest["spec"]["training"] = {"steps": 10, "epochs": 3}
    with pytest.raises(ValueError, match="training.steps or training.epochs, not both"):
        load_config(_write(tmp_path, manifest), volumes)


def test_export_goes_to_the_claim_the_spec_names(tmp_path, volumes):
    """The cluster exports to spec.export.claimName/path; so does the local run."""
    drafts = tmp_path / "vol-drafts"
    manifest = yaml.safe_load(yaml.safe_dump(MANIFEST))
    manifest["spec"]["export"] = {"claimName": "drafts", "path": "tiny/eagle3"}
    runner = _runner(tmp_path, {**volumes, "drafts": drafts}, manifest)
    assert _flag(runner.argv("export"), "--output") == str(drafts.resolve() / "tiny" / "eagle3")
    manifest["spec"]["export"] = {"claimName": "drafts", "quantize": "fp8"}  # path: the training's name
    runner = _runner(tmp_path, {**volumes, "drafts": drafts}, manifest)
    assert _flag(runner.argv("export"), "--output") == str(tmp_path / "ws" / "export")
    quantize = runner.argv("quantize")
    assert (_flag(quantize, "--input"), _flag(quantize, "--output")) == (
        str(tmp_path / "ws" / "export" / "latest"),
        str(drafts.resolve() / "tiny"),
    )


def test_a_bare_spec_is_named_after_its_file(tmp_path, volumes):
    spec = yaml.safe_load(yaml.safe_dump(MANIFEST["spec"]))
    spec["export"] = {"claimName": "drafts"}
    path = tmp_path / "my-draft.yaml"
    path.write_text(yaml.safe_dump(spec))
    config = load_config(path, volumes)
    assert config.training.metadata["name"] == "my-draft"
    assert _flag(PipelineRunner(config, tmp_path / "ws").argv("export"), "--output") == str(
        (tmp_path / "drafts" / "my-draft").resolve()
    )


def test_the_generate_server_serves_the_target_as_the_operators_deployment_does(tmp_path, volumes):
    """Same revision, parallelism, quantization, attention backend and extra arguments as the
    target Deployment's `vllm serve`, under the same served name."""
    from eagle3_operator.reconcile.pods import vllm_args

    from eagle3_api.draft_training import DraftTraining

    manifest = yaml.safe_load(yaml.safe_dump(MANIFEST))
    manifest["spec"]["target"] |= {
        "revision": "0123abc",
        "tensorParallelSize": 2,
        "quantization": "fp8",
        "attentionBackend": "TRITON_ATTN",
        "extraArgs": ["--enforce-eager"],
    }
    command = _runner(tmp_path, volumes, manifest).target_server().command
    target = DraftTraining.model_validate(manifest).spec.target
    deployment = vllm_args(target, "/models/tiny", "pvc://models/tiny")
    served = command[command.index("--served-model-name") :]
    for flag in ("--served-model-name", "--max-model-len", "--revision", "--tensor-parallel-size",
                 "--quantization", "--attention-backend"):  # fmt: skip
        assert _flag(served, flag) == _flag(deployment, flag), flag
    assert _flag(command, "--revision") == "0123abc"
    assert command[-1] == deployment[-1] == "--enforce-eager", "the user's arguments come last and win"
