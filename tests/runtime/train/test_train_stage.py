"""`eagle3 train` from offline shards, online states against Hugging Face, and bad input."""

import json

import pytest
import torch
from transformers import LlamaForCausalLM

from eagle3_api.workspace import Workspace
from eagle3_runtime.cli import main as eagle3
from eagle3_runtime.hidden_states import HiddenStateSample, write_samples
from eagle3_runtime.target import OnlineHiddenStates, TargetHead
from eagle3_runtime.vllm_server import free_port
from tests.runtime.model.test_model import tiny_target_config


@pytest.fixture(scope="module")
def target_dir(tmp_path_factory):
    torch.manual_seed(0)
    config = tiny_target_config(vocab_size=64, tie_word_embeddings=False)
    path = tmp_path_factory.mktemp("target")
    LlamaForCausalLM(config).save_pretrained(path)
    return path


def test_online_states_are_the_residual_entering_each_layer_and_the_last_pre_norm(target_dir):
    model = LlamaForCausalLM.from_pretrained(target_dir).eval()
    ids = torch.randint(0, 64, (12,))
    with torch.no_grad():
        out = model(ids[None], output_hidden_states=True)
    states = OnlineHiddenStates(str(target_dir), [1, 2, 3])(ids)
    assert states.shape == (12, 4, 32)
    for slot, layer in enumerate([1, 2, 3]):  # HF output_hidden_states[l] enters layer l
        torch.testing.assert_close(states[:, slot], out.hidden_states[layer][0])
    # the last slot is pre-norm: the target head turns it into the model's own logits
    head = TargetHead.from_pretrained(str(target_dir))
    torch.testing.assert_close(head(states[:, 3]), out.logits[0], atol=1e-4, rtol=1e-4)


def _write_states(target_dir, workspace, layer_ids=(1, 2, 3), hidden=None, count=12):
    states = OnlineHiddenStates(str(target_dir), list(layer_ids))
    g = torch.Generator().manual_seed(0)

    def samples():
        for _ in range(count):
            ids = torch.randint(0, 64, (40,), generator=g)
            mask = torch.arange(40) >= 10
            h = states(ids)
            yield HiddenStateSample(ids, mask, h if hidden is None else h[..., :hidden])

    return write_samples(
        workspace.hidden_states_dir,
        samples(),
        layer_ids=list(layer_ids),
        num_hidden_layers=4,
        hidden_size=hidden or 32,
        samples_per_shard=4,
    )


def train_args(workspace, target_dir, *extra):
    return [
        "train",
        "--workspace",
        str(workspace.root),
        "--target",
        str(target_dir),
        "--hidden-states",
        "offline",
        "--draft-vocab-size",
        "48",
        "--steps",
        "4",
        "--learning-rate",
        "1e-3",
        "--batch-tokens",
        "128",
        "--seq-len",
        "128",
        "--ttt-steps",
        "2",
        "--checkpoint-every",
        "2",
        "--result-file",
        str(workspace.root / "result.json"),
        *extra,
    ]


def test_train_stage_offline_then_noop(tmp_path, target_dir, monkeypatch):
    """As one torchrun rank (its env variables): `eagle3 train` also destroys its gloo group before it
    exits; a group left to interpreter teardown can abort the rank (SIGABRT, "terminate called
    without an active exception"), seen failing a 2-node trainer Job."""
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", str(free_port()))
    for name, value in (("RANK", "0"), ("LOCAL_RANK", "0"), ("WORLD_SIZE", "1")):
        monkeypatch.setenv(name, value)
    workspace = Workspace(tmp_path / "ws")
    _write_states(target_dir, workspace)
    try:
        assert eagle3(train_args(workspace, target_dir)) == 0
        assert not torch.distributed.is_initialized(), "eagle3 train left its process group alive"
    finally:
        if torch.distributed.is_initialized():  # keep this pytest process clean for the next tests
            torch.distributed.destroy_process_group()
    result = json.loads((workspace.root / "result.json").read_text())
    assert (
        result["ok"]
        and result["metrics"]["step"] == 4
        and [int(s) for s in result["metrics"]["checkpoints"]] == [2, 4]
    )
    assert len(result["metrics"]["accuracy_per_position"]) == 2
    config = json.loads((workspace.checkpoint_dir(4) / "config.json").read_text())
    assert config["eagle_aux_hidden_state_layer_ids"] == [1, 2, 3] and config["draft_vocab_size"] == 48
    progress = json.loads((workspace.root / "progress" / "train.json").read_text())
    assert progress["step"] == 4 and progress["totalSteps"] == 4
    lines = (workspace.reports_dir / "train-metrics.jsonl").read_text().splitlines()
    assert [json.loads(line)["step"] for line in lines] == [1, 2, 3, 4]
    # a finished run is a no-op with the same result
    assert eagle3(train_args(workspace, target_dir)) == 0
    assert json.loads((workspace.root / "result.json").read_text())["metrics"]["step"] == 4


def _failure(workspace, target_dir, *extra) -> str:
    assert eagle3(train_args(workspace, target_dir, *extra)) == 1
    return json.loads((workspace.root / "result.json").read_text())["message"]


def test_train_stage_bad_input(tmp_path, target_dir):
    empty = Workspace(tmp_path / "empty")
    empty.root.mkdir()
    assert "run `eagle3 extract" in _failure(empty, target_dir)

    narrow = Workspace(tmp_path / "narrow")
    _write_states(target_dir, narrow, hidden=16, count=4)
    assert "hidden_size" in _failure(narrow, target_dir)

    other_layers = Workspace(tmp_path / "layers")
    _write_states(target_dir, other_layers, count=4)
    assert "extracted states" in _failure(other_layers, target_dir, "--layer-ids", "0,1,2")

    missing = Workspace(tmp_path / "missing")
    _write_states(target_dir, missing, count=8)
    (missing.hidden_states_dir / "shard-00001.safetensors").unlink()
    assert "missing" in _failure(missing, target_dir)

    assert "larger than the target" in _failure(other_layers, target_dir, "--draft-vocab-size", "65")


def _epoch_args(workspace, target_dir, epochs, *extra):
    args = train_args(workspace, target_dir, *extra)
    at = args.index("--steps")
    return [*args[:at], "--epochs", str(epochs), *args[at + 2 :]]


def test_epochs_derive_the_step_total_from_the_data(tmp_path, target_dir):
    workspace = Workspace(tmp_path / "ws")
    _write_states(target_dir, workspace, count=12)
    # 12 samples of 40 tokens, three to a 128-token row: 4 rows per epoch; 128 batch tokens = 1 row
    # per step, so 2 epochs = 8 steps.
    assert eagle3(_epoch_args(workspace, target_dir, 2)) == 0
    result = json.loads((workspace.root / "result.json").read_text())
    assert (result["metrics"]["step"], result["metrics"]["total_steps"], result["metrics"]["epochs"]) == (
        8,
        8,
        2,
    )
    assert result["message"] == "trained 8/8 steps (2 epochs)"
    progress = json.loads((workspace.root / "progress" / "train.json").read_text())
    assert (progress["step"], progress["totalSteps"]) == (8, 8)
    state = torch.load(workspace.checkpoint_dir(8) / "training_state.pt", weights_only=False)
    assert state["rows_consumed"] == 8 and state["settings"]["epochs"] == 2
    # the same request again is a no-op; one more epoch continues from step 8 to 12
    assert eagle3(_epoch_args(workspace, target_dir, 2)) == 0
    assert json.loads((workspace.root / "result.json").read_text())["metrics"]["total_steps"] == 8
    assert eagle3(_epoch_args(workspace, target_dir, 3)) == 0
    result = json.loads((workspace.root / "result.json").read_text())
    assert (result["metrics"]["step"], result["metrics"]["total_steps"]) == (12, 12)
    lines = (workspace.reports_dir / "train-metrics.jsonl").read_text().splitlines()
    assert [json.loads(line)["step"] for line in lines] == list(range(1, 13))


def test_steps_and_epochs_together_are_refused(tmp_path, target_dir):
    workspace = Workspace(tmp_path / "ws")
    with pytest.raises(SystemExit):
        eagle3(train_args(workspace, target_dir, "--epochs", "2"))


def test_warm_start_continues_from_the_checkpoints_loss(tmp_path, target_dir):
    first = Workspace(tmp_path / "first")
    _write_states(target_dir, first)
    assert eagle3(train_args(first, target_dir, "--learning-rate", "3e-3")) == 0
    trained_loss = json.loads((first.root / "result.json").read_text())["metrics"]["loss"]
    scratch_loss = json.loads((first.reports_dir / "train-metrics.jsonl").read_text().splitlines()[0])["loss"]

    warm = Workspace(tmp_path / "warm")
    _write_states(target_dir, warm)
    init = str(first.checkpoint_dir(4))
    assert eagle3(train_args(warm, target_dir, "--init-checkpoint", init, "--learning-rate", "1e-9")) == 0
    result = json.loads((warm.root / "result.json").read_text())
    assert result["metrics"]["initialized_from"] == init
    first_warm_loss = json.loads((warm.reports_dir / "train-metrics.jsonl").read_text().splitlines()[0])[
        "loss"
    ]
    # Same data, no learning: the warm start's first loss is where the first run ended, far below scratch.
    assert first_warm_loss == pytest.approx(trained_loss, rel=0.1) and first_warm_loss < 0.8 * scratch_loss
    manifest = json.loads((warm.checkpoint_dir(4) / "manifest.json").read_text())
    assert manifest["initialization"] == {
        "initialized_from": init,
        "lm_head_rows_from_checkpoint": 48,
        "lm_head_rows_from_target": 0,
    }

    two_layers = Workspace(tmp_path / "two")
    _write_states(target_dir, two_layers, count=4)
    message = _failure(two_layers, target_dir, "--init-checkpoint", init, "--draft-layers", "2")
    assert "has 1 decoder layer(s), the draft being trained has 2" in message


def test_resuming_with_another_layer_count_is_refused(tmp_path, target_dir):
    workspace = Workspace(tmp_path / "ws")
    _write_states(target_dir, workspace, count=4)
    assert eagle3(train_args(workspace, target_dir, "--steps", "2")) == 0
    message = _failure(workspace, target_dir, "--draft-layers", "2")
    assert "step-00000002 has 1 decoder layer(s), this run 2" in message
    # The checkpoints' manifest names the target they were trained for; another target never resumes them.
    other_target = tmp_path / "other-target"
    other_target.symlink_to(target_dir)
    message = _failure(workspace, other_target)
    assert f"step-00000002 was made from target {target_dir}, this run's target is {other_target}" in message


def test_loss_chunk_rows_reaches_the_trainer_and_trains_the_same_draft(tmp_path, target_dir):
    """`--loss-chunk-rows` (training.lossChunkRows) changes memory, not the result: the same
    losses step for step, recorded in the checkpoint's settings."""
    losses = {}
    for chunk in (None, 50):
        workspace = Workspace(tmp_path / f"chunk-{chunk}")
        _write_states(target_dir, workspace)
        extra = () if chunk is None else ("--loss-chunk-rows", str(chunk))
        assert eagle3(train_args(workspace, target_dir, *extra)) == 0
        state = torch.load(workspace.checkpoint_dir(4) / "training_state.pt", weights_only=False)
        assert state["settings"]["loss_chunk_rows"] == chunk
        lines = (workspace.reports_dir / "train-metrics.jsonl").read_text().splitlines()
        losses[chunk] = [json.loads(line)["loss"] for line in lines]
    assert len(losses[None]) == 4 and losses[50] == pytest.approx(losses[None], rel=1e-5)
