"""`eagle3 pipeline --config`: a DraftTraining manifest, validated by the operator's models, mapped to local paths."""

from __future__ import annotations

import pytest
import yaml

from eagle3_runtime.pipeline.config import load_config, parse_volumes
from eagle3_runtime.pipeline.runner import checkpoints_to_evaluate

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
        "training": {"steps": 10, "checkpointEvery": 5, "tttSteps": 2},
        "evaluation": {"everyCheckpoints": 2, "prompts": {"claimName": "prompts", "path": "eval.jsonl"}},
    },
    "local": {"eval_prompts_per_domain": 4},
}


@pytest.fixture
def volumes(tmp_path):
    (tmp_path / "vol-models" / "tiny").mkdir(parents=True)
    prompts = tmp_path / "vol-prompts"
    prompts.mkdir()
    for name in ("chat.jsonl", "raw.jsonl", "eval.jsonl"):
        (prompts / name).write_text('{"prompt": "x"}\n')
    return parse_volumes([f"models={tmp_path / 'vol-models'}", f"prompts={prompts}"])


def test_manifest_maps_to_local_paths_and_settings(tmp_path, volumes):
    path = tmp_path / "training.yaml"
    path.write_text(yaml.safe_dump(MANIFEST))
    config = load_config(path, volumes)
    assert config.target == str((tmp_path / "vol-models" / "tiny").resolve())
    assert [s.path for s in config.sources] == [
        str(volumes["prompts"].resolve() / n) for n in ("chat.jsonl", "raw.jsonl")
    ]
    assert config.sources[0].messages_field == "conversations" and config.sources[1].weight == 0.5
    assert config.sources[1].mode == "completion"
    assert config.eval_prompts[0].path.endswith("eval.jsonl")
    assert (config.hidden_states, config.layer_ids, config.draft_vocab_size) == ("streaming", "1,2,3", 1024)
    assert (config.steps, config.checkpoint_every, config.ttt_steps, config.temperature) == (10, 5, 2, 0)
    assert config.local.max_model_len == 512 and config.local.eval_prompts_per_domain == 4


def test_invalid_manifest_is_refused_with_the_field(tmp_path, volumes):
    bad = yaml.safe_load(yaml.safe_dump(MANIFEST))
    bad["spec"]["training"]["tttSteps"] = 0
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(bad))
    with pytest.raises(ValueError, match=r"(?s)not a valid DraftTraining spec.*tttSteps"):
        load_config(path, volumes)


def test_missing_volume_path_is_named(tmp_path):
    path = tmp_path / "training.yaml"
    path.write_text(yaml.safe_dump(MANIFEST))
    with pytest.raises(FileNotFoundError, match="--volume prompts=DIR"):
        load_config(path, {"models": tmp_path})


def test_epochs_draft_layers_and_warm_start_reach_the_local_run(tmp_path, volumes):
    head = volumes["models"] / "eagle3-head"
    head.mkdir()
    manifest = yaml.safe_load(yaml.safe_dump(MANIFEST))
    manifest["spec"]["training"] = {"epochs": 3}
    manifest["spec"]["draft"] = {
        "layers": 2,
        "initialization": {"from": "checkpoint", "path": "pvc://models/eagle3-head"},
    }
    path = tmp_path / "training.yaml"
    path.write_text(yaml.safe_dump(manifest))
    config = load_config(path, volumes)
    assert (config.steps, config.epochs, config.draft_layers) == (None, 3, 2)
    assert config.init_checkpoint == str(head.resolve())
    manifest["spec"]["training"] = {}
    manifest["spec"]["draft"] = {}
    path.write_text(yaml.safe_dump(manifest))
    config = load_config(path, volumes)
    assert (config.steps, config.epochs, config.draft_layers, config.init_checkpoint) == (2000, None, 1, None)
    manifest["spec"]["training"] = {"steps": 10, "epochs": 3}
    path.write_text(yaml.safe_dump(manifest))
    with pytest.raises(ValueError, match="training.steps or training.epochs, not both"):
        load_config(path, volumes)


def test_checkpoints_to_evaluate_takes_first_every_nth_and_last():
    assert checkpoints_to_evaluate([5, 10, 15, 20], 2) == [5, 15, 20]
    assert checkpoints_to_evaluate([5, 10, 15], 1) == [5, 10, 15]
    assert checkpoints_to_evaluate([7], 3) == [7]
