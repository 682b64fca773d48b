"""Export formats: what vLLM's own loaders read from the plain and the speculators directories."""

import json
from pathlib import Path

import torch
from safetensors.torch import load_file
from vllm.transformers_utils.configs.speculators.base import SpeculatorsConfig

from eagle3_api.workspace import LATEST_EXPORT, Workspace, export_version
from eagle3_runtime.cli import build_parser
from eagle3_runtime.cli import main as eagle3
from eagle3_runtime.evaluate.sweep import sweep_file
from eagle3_runtime.export import EXPORT_MANIFEST, draft_digest, write_eagle3_dir
from eagle3_runtime.stages import sweep as sweep_stage
from eagle3_runtime.train.checkpoint import write_checkpoint
from tests.runtime.model.test_model import tiny_draft


def test_d2t_and_t2d_only_when_the_draft_vocabulary_is_smaller(tmp_path):
    small = tiny_draft(draft_vocab_size=20)
    weights = load_file(
        str(
            write_eagle3_dir(tmp_path / "small", small.trainable_state_dict(), small.config)
            / "model.safetensors"
        )
    )
    assert weights["d2t"].dtype == torch.int64 and weights["t2d"].dtype == torch.bool
    assert weights["lm_head.weight"].shape == (20, 32) and weights["fc.weight"].dtype == torch.bfloat16
    assert not any(k.startswith("embed_tokens") for k in weights)

    full = tiny_draft(draft_vocab_size=50)
    out = write_eagle3_dir(tmp_path / "full", full.trainable_state_dict(), full.config)
    assert "d2t" not in load_file(str(out / "model.safetensors"))  # vLLM refuses d2t then
    config = json.loads((out / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLMEagle3"]
    assert (config["draft_vocab_size"], config["vocab_size"], config["num_hidden_layers"]) == (50, 50, 1)


def _workspace_with_checkpoint(tmp_path, step=4):
    draft = tiny_draft(draft_vocab_size=20)
    target = tmp_path / "target-model"  # the verifier's config.json, whose architecture the export records
    target.mkdir()
    (target / "config.json").write_text(json.dumps({"architectures": ["Qwen3MoeForCausalLM"]}))
    workspace = Workspace(tmp_path / "ws")
    write_checkpoint(
        workspace,
        step,
        model_state=draft.trainable_state_dict(),
        draft_config=draft.config,
        training_state={},
        manifest={"target": str(target)},
    )
    return workspace


def test_speculators_export_is_read_by_vllm(tmp_path):
    workspace = _workspace_with_checkpoint(tmp_path)
    out = tmp_path / "spec"
    assert (
        eagle3(
            [
                "export",
                "--workspace",
                str(workspace.root),
                "--checkpoint",
                "step-4",
                "--format",
                "speculators",
                "--output",
                str(out),
                "--num-speculative-tokens",
                "5",
            ]
        )
        == 0
    )
    out = out / LATEST_EXPORT
    raw = json.loads((out / "config.json").read_text())
    layer = SpeculatorsConfig.extract_transformers_pre_trained_config(json.loads(json.dumps(raw)))
    assert layer["architectures"] == ["Eagle3LlamaForCausalLM"]
    assert layer["draft_vocab_size"] == 20 and layer["eagle_aux_hidden_state_layer_ids"] == [1, 2, 3]
    assert layer["norm_before_residual"] is False  # the residual is taken before hidden_norm, as we train
    assert SpeculatorsConfig.extract_vllm_speculative_config(raw) == {
        "method": "eagle3",
        "num_speculative_tokens": 5,
    }
    assert raw["speculators_config"]["verifier"] == {
        "name_or_path": str(tmp_path / "target-model"),
        "architectures": ["Qwen3MoeForCausalLM"],
    }
    weights = load_file(str(out / "model.safetensors"))
    assert "layers.0.self_attn.q_proj.weight" in weights and not any(
        k.startswith("midlayer.") for k in weights
    )
    assert weights["layers.0.mlp.down_proj.weight"].dtype == torch.bfloat16


def test_export_checkpoint_choice_and_errors(tmp_path):
    workspace = _workspace_with_checkpoint(tmp_path)
    result = tmp_path / "result.json"
    export_best = [
        "export",
        "--workspace",
        str(workspace.root),
        "--checkpoint",
        "best",
        "--result-file",
        str(result),
    ]
    assert eagle3(export_best) == 1
    assert "eagle3 select" in json.loads(result.read_text())["message"]
    workspace.selection_file.write_text(json.dumps({"step": 4, "acceptance_length": 2.7}))
    assert eagle3(export_best) == 0
    published = json.loads(result.read_text())
    digest = published["metrics"]["digest"]
    version = workspace.export_dir / export_version(digest)
    assert published["artifacts"]["path"] == str(version)
    assert (version / "model.safetensors").exists()
    assert eagle3(["export", "--workspace", str(workspace.root), "--checkpoint", "step-9"]) == 1


def _export(workspace: Workspace, step: int, result: Path) -> tuple[Path, str]:
    """`eagle3 export` of checkpoint `step`: the published directory and its digest, from the result."""
    argv = ["export", "--workspace", str(workspace.root), "--checkpoint", f"step-{step}"]
    assert eagle3([*argv, "--result-file", str(result)]) == 0
    published = json.loads(result.read_text())
    return Path(published["artifacts"]["path"]), published["metrics"]["digest"]


def test_an_export_is_published_under_its_digest_and_never_overwritten(tmp_path):
    workspace = _workspace_with_checkpoint(tmp_path, step=4)
    draft = tiny_draft(draft_vocab_size=20, seed=1)
    write_checkpoint(
        workspace,
        8,
        model_state=draft.trainable_state_dict(),
        draft_config=draft.config,
        training_state={},
        manifest={"target": str(tmp_path / "target-model")},
    )

    result_file = tmp_path / "result.json"
    first, first_digest = _export(workspace, 4, result_file)
    first_weights = (first / "model.safetensors").read_bytes()
    manifest = json.loads((first / EXPORT_MANIFEST).read_text())
    assert manifest == {"digest": first_digest, "format": "eagle3", "checkpoint_step": 4}
    assert draft_digest(first) == first_digest  # what is on disk is what the digest names
    assert workspace.latest_export_dir.resolve() == first.resolve()

    second, second_digest = _export(workspace, 8, result_file)
    assert second_digest != first_digest and second.name == export_version(second_digest)
    assert (first / "model.safetensors").read_bytes() == first_weights, "the first export was overwritten"
    assert workspace.latest_export_dir.resolve() == second.resolve()

    # The same content: the published directory, untouched.
    again, again_digest = _export(workspace, 4, result_file)
    assert (again, again_digest) == (first, first_digest)
    assert sorted(p.name for p in workspace.export_dir.iterdir()) == sorted(
        [first.name, second.name, LATEST_EXPORT]
    ), "no staging directory is left behind"


def test_a_new_schedule_for_the_same_weights_is_a_new_version_and_the_kept_sweep_is_decided_again(tmp_path):
    """A sweep record kept from an older rule (the deep target's argmax schedule) is decided again by
    `eagle3 sweep` (no server starts: the measurements are kept) and written back; export then
    publishes the same weights with the new schedule under a new digest, the old version untouched."""
    workspace = _workspace_with_checkpoint(tmp_path, step=4)
    speedups = {1: (2.019, 1.834), 2: (2.016, 2.136), 4: (1.885, 1.729), 8: (1.738, 1.811)}
    measurements = [
        {"num_speculative_tokens": k, "concurrency": c, "speedup": s}
        for c, row in speedups.items()
        for k, s in zip((4, 5), row, strict=True)
    ]
    argmax_schedule = [[1, 1, 4], [2, 5, 5], [6, 8, 5]]  # what an argmax per concurrency made: K 4, 5, 4, 5
    kept = sweep_file(workspace, "step-00000004")
    kept.parent.mkdir(parents=True, exist_ok=True)
    kept.write_text(
        json.dumps(
            {
                "measurements": measurements,
                "schedule": argmax_schedule,
                "file": str(kept.relative_to(workspace.root)),
            }
        )
    )

    result_file = tmp_path / "result.json"
    old, old_digest = _export(workspace, 4, result_file)
    assert json.loads((old / EXPORT_MANIFEST).read_text())["speculation_schedule"] == argmax_schedule

    argv = ["sweep", "--workspace", str(workspace.root), "--target", "unused", "--checkpoint", "step-4",
            "--prompts", f"{tmp_path / 'unused.jsonl'},mode=completion", "--concurrency", "1"]  # fmt: skip
    (tmp_path / "unused.jsonl").write_text(json.dumps({"prompt": "x"}) + "\n")
    result = sweep_stage.run(build_parser(argv).parse_args(argv))
    assert result.metrics["schedule"] == [[1, 8, 4]]  # smoothed: K = 4 at every concurrency
    assert json.loads(kept.read_text())["schedule"] == [[1, 8, 4]], "the kept record says what was decided"

    new, new_digest = _export(workspace, 4, result_file)
    assert new_digest != old_digest and new != old
    assert json.loads((new / EXPORT_MANIFEST).read_text())["speculation_schedule"] == [[1, 8, 4]]
    assert json.loads((old / EXPORT_MANIFEST).read_text())["speculation_schedule"] == argmax_schedule
    assert (new / "model.safetensors").read_bytes() == (old / "model.safetensors").read_bytes()
    assert draft_digest(new) == new_digest and draft_digest(old) == old_digest
