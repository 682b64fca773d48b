"""Trainer: learning, FSDP2 over 2 gloo processes == 1 process, exact resume, clear errors."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from transformers import LlamaConfig

from eagle3_api.workspace import Workspace
from eagle3_runtime.extract.offline import with_target_top1
from eagle3_runtime.hidden_states import iter_shard_samples, write_samples
from eagle3_runtime.model.config import draft_config_from_target
from eagle3_runtime.model.vocab import build_draft_vocab, count_tokens
from eagle3_runtime.target import TargetHead
from eagle3_runtime.train.distributed import init_distributed
from eagle3_runtime.train.synthetic import synthetic_samples, synthetic_target
from eagle3_runtime.train.trainer import METRICS_FILE, DraftTrainer, TrainSettings
from eagle3_runtime.vllm_server import free_port
from tests.runtime.model.test_model import tiny_target_config

VOCAB, HIDDEN = 64, 32


def make_trainer(
    workspace,
    *,
    steps=8,
    checkpoint_every=0,
    num_samples=12,
    hidden=HIDDEN,
    draft_vocab=48,
    device="cpu",
    head_dim=8,
    source=None,
    **kw,
):
    target = synthetic_target(VOCAB, HIDDEN)
    config = tiny_target_config(
        hidden_size=HIDDEN, head_dim=head_dim, vocab_size=VOCAB, max_position_embeddings=512
    )
    draft_config = draft_config_from_target(config, layer_ids="auto", draft_vocab_size=draft_vocab)

    def synthetic_source():
        target_for_states = synthetic_target(VOCAB, hidden)
        return synthetic_samples(target_for_states, num_samples=num_samples, length=40, seed=1)

    source = source or synthetic_source

    vocab = build_draft_vocab(
        count_tokens(((s.input_ids, s.loss_mask) for s in source()), VOCAB), draft_vocab
    )
    settings = TrainSettings(
        steps=steps,
        learning_rate=3e-3,
        batch_tokens=256,
        seq_len=128,
        ttt_steps=3,
        checkpoint_every=checkpoint_every,
        warmup_steps=2,
        **kw,
    )
    return DraftTrainer(
        settings=settings,
        draft_config=draft_config,
        vocab=vocab,
        embeddings=target["embeddings"],
        target_head=TargetHead(target["norm"], target["lm_head"], config.rms_norm_eps),
        source=source,
        context=init_distributed(device),
        workspace=Workspace(workspace) if workspace else None,
        show_progress_bar=False,
    )


def losses(workspace) -> dict[int, float]:
    lines = (Path(workspace) / "reports" / METRICS_FILE).read_text().splitlines()
    return {r["step"]: r["loss"] for r in map(json.loads, lines)}


def test_training_learns_the_synthetic_chain(tmp_path):
    trainer = make_trainer(tmp_path, steps=30)
    first = trainer.train_step()
    for _ in range(29):
        last = trainer.train_step()
    assert last["loss"] < 0.85 * first["loss"]
    assert last["accuracy_per_position"][0] > 0.4 > first["accuracy_per_position"][0]
    assert last["simulated_acceptance_length"] > first["simulated_acceptance_length"]


def test_resume_gives_the_same_losses_as_an_uninterrupted_run(tmp_path):
    make_trainer(tmp_path / "straight", steps=6, checkpoint_every=3).train()
    interrupted = make_trainer(tmp_path / "resumed", steps=6, checkpoint_every=3)
    for _ in range(4):  # checkpoint at 3, then one more step that is lost in the "crash"
        interrupted.last_summary = interrupted.train_step()
        interrupted._log_metrics(interrupted.last_summary)
        if interrupted.step == 3:
            interrupted.save_checkpoint()
    resumed = make_trainer(tmp_path / "resumed", steps=6, checkpoint_every=3)
    assert resumed.step == 3
    resumed.train()
    straight, again = losses(tmp_path / "straight"), losses(tmp_path / "resumed")
    assert sorted(again) == [1, 2, 3, 4, 5, 6]
    for step in range(1, 7):
        assert again[step] == pytest.approx(straight[step], rel=1e-6, abs=1e-7), step
    manifest = json.loads((tmp_path / "resumed/checkpoints/step-00000006/manifest.json").read_text())
    assert manifest["step"] == 6
    assert (tmp_path / "resumed/checkpoints/step-00000006/config.json").exists()


def _start_world(world_size: int, out: Path, *args: str) -> list[subprocess.Popen]:
    """One process per rank, as torchrun starts them (this file's __main__)."""
    # The repository root, so that this file run as a script imports `tests` as pytest's process does.
    root = str(Path(__file__).resolve().parents[3])
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")])),
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(free_port()),
        "WORLD_SIZE": str(world_size),
        "OMP_NUM_THREADS": "1",
    }
    return [
        subprocess.Popen(
            [sys.executable, __file__, str(out), *args], env={**env, "RANK": str(r), "LOCAL_RANK": str(r)}
        )
        for r in range(world_size)
    ]


def _run_world(world_size: int, out: Path) -> dict[int, float]:
    for p in _start_world(world_size, out):
        assert p.wait(timeout=300) == 0
    return losses(out)


def test_two_gloo_processes_match_one(tmp_path):
    one = _run_world(1, tmp_path / "one")
    two = _run_world(2, tmp_path / "two")
    assert sorted(one) == sorted(two) == list(range(1, 9))
    for step in one:
        assert two[step] == pytest.approx(one[step], rel=1e-4), step
    assert two[8] < two[1]


def test_a_group_restarted_after_a_rank_died_resumes_as_if_never_stopped(tmp_path):
    """What the operator does when one rank of a multi-node training fails (training.groupRestarts):
    rank 1 dies after the step-4 checkpoint, the group is stopped (rank 0 is killed, as the Job
    controller stops it) and started again as a whole; every rank resumes from step 4, and the
    losses are those of a group that was never stopped."""
    straight = _run_world(2, tmp_path / "straight")
    first = _start_world(2, tmp_path / "restarted", "--rank-1-dies-at", "6")
    assert first[1].wait(timeout=300) == RANK_DIED
    try:
        first[0].wait(timeout=10)  # gloo may notice the lost peer; a hung collective is stopped below
    except subprocess.TimeoutExpired:
        first[0].kill()
        first[0].wait()
    assert not (tmp_path / "restarted/checkpoints/step-00000008").exists()
    restarted = _run_world(2, tmp_path / "restarted")
    assert sorted(restarted) == sorted(straight) == list(range(1, 9))
    for step in straight:
        assert restarted[step] == pytest.approx(straight[step], rel=1e-6, abs=1e-7), step


def test_shards_that_carry_the_target_top1_train_as_the_full_head_does(tmp_path):
    """Offline extraction stores the target's top-1 with the states; the shards keep it, packed rows
    carry it, and the trainer then computes only the draft vocabulary's rows of the head: the same
    losses as from states without it."""
    target = synthetic_target(VOCAB, HIDDEN)
    head = TargetHead(target["norm"], target["lm_head"], LlamaConfig().rms_norm_eps)
    samples = with_target_top1(synthetic_samples(target, num_samples=12, length=40, seed=1), head)
    shards = tmp_path / "shards"
    write_samples(
        shards, samples, layer_ids=[1, 2, 3], num_hidden_layers=4, hidden_size=HIDDEN, samples_per_shard=5
    )
    stored = make_trainer(None, steps=3, source=lambda: iter_shard_samples(shards))
    plain = make_trainer(None, steps=3)
    for _ in range(3):
        assert stored.train_step()["loss"] == pytest.approx(plain.train_step()["loss"], rel=1e-5)
    batch, _ = stored._batch()
    assert batch.target_top1 is not None and batch.target_logits.shape[-1] == 48  # the draft vocabulary


def test_a_chunked_loss_trains_as_the_whole_one_does():
    """`loss_chunk_rows` (lm_head and the KL a chunk of rows at a time) changes memory, not the
    numbers: the same losses and gradient norms step for step."""
    chunked, whole = make_trainer(None, steps=3, loss_chunk_rows=50), make_trainer(None, steps=3)
    for _ in range(3):
        a, b = chunked.train_step(), whole.train_step()
        assert a["loss"] == pytest.approx(b["loss"], rel=1e-5)
        assert a["grad_norm"] == pytest.approx(b["grad_norm"], rel=1e-4)
    with pytest.raises(ValueError, match="at least one row"):
        make_trainer(None, loss_chunk_rows=0).train_step()


def test_errors_are_clear(tmp_path):
    with pytest.raises(ValueError, match="hidden_size"):
        make_trainer(None, hidden=HIDDEN + 8).train_step()
    with pytest.raises(ValueError, match="empty"):
        make_trainer(None, num_samples=0)
    with pytest.raises(ValueError, match="larger than the target"):
        make_trainer(None, draft_vocab=VOCAB + 1)


RANK_DIED = 17

if __name__ == "__main__":  # one rank of the gloo tests, started under torchrun's env variables
    torch.set_num_threads(1)
    trainer = make_trainer(sys.argv[1], steps=8, checkpoint_every=4)
    if "--rank-1-dies-at" in sys.argv:
        dies_at = int(sys.argv[sys.argv.index("--rank-1-dies-at") + 1])
        while trainer.step < dies_at - 1:  # the step-4 checkpoint is written on the way
            trainer.last_summary = trainer.train_step()
            trainer._log_metrics(trainer.last_summary)
            if trainer.step % trainer.settings.checkpoint_every == 0:
                trainer.save_checkpoint()
        if trainer.context.rank == 1:
            os._exit(RANK_DIED)  # the rank's pod is gone, mid-training
        trainer.train_step()  # rank 0 waits for its lost peer
    else:
        trainer.train()
    trainer.context.close()


def test_epoch_length_is_the_rows_one_pass_packs():
    """rows_per_epoch (token lengths only) == the rows pack_rows builds from the samples themselves."""
    from eagle3_runtime.hidden_states import HiddenStateSample
    from eagle3_runtime.train.data import pack_rows, rows_per_epoch, steps_for_epochs

    lengths = [1, 40, 300, 90, 2, 128, 60, 61, 7, 129, 0, 33]  # too short, too long, exact fits
    samples = [
        HiddenStateSample(
            torch.zeros(n, dtype=torch.long), torch.ones(n, dtype=torch.bool), torch.zeros(n, 4, 8)
        )
        for n in lengths
    ]
    packed = list(pack_rows(samples, 128, hidden_size=8, vocab_size=VOCAB))
    assert rows_per_epoch(lengths, 128) == len(packed) == 7
    assert steps_for_epochs(3, 7, 2) == 11  # 21 rows at 2 a step: the 11th step starts the 4th pass
    with pytest.raises(ValueError, match="dataset is empty"):
        steps_for_epochs(1, rows_per_epoch([1, 0], 128), 2)
