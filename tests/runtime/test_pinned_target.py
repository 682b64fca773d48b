"""A DraftTraining's target.revision: every stage reads that revision, and its manifests record it, so
a resumed run for another revision refuses to mix data. Hugging Face ids are resolved from a local hub
cache laid out as the hub writes it (offline: nothing is downloaded)."""

from __future__ import annotations

import json

import huggingface_hub.constants
import pytest
import torch

from eagle3_runtime.hidden_states import HiddenStateSample, read_manifest, write_samples
from eagle3_runtime.pinned_target import PinnedTarget, pin_target


@pytest.fixture
def hub_cache(tmp_path, monkeypatch):
    """A hub cache holding acme/tiny at two commits, tagged v1 and v2."""
    cache = tmp_path / "hub"
    repo = cache / "models--acme--tiny"
    for tag, commit in (("v1", "1" * 40), ("v2", "2" * 40)):
        snapshot = repo / "snapshots" / commit
        snapshot.mkdir(parents=True)
        (snapshot / "config.json").write_text(json.dumps({"tag": tag}))
        (snapshot / "chat_template.jinja").write_text("{{ messages }}")
        (repo / "refs").mkdir(exist_ok=True)
        (repo / "refs" / tag).write_text(commit)
    # huggingface_hub reads its environment once, at import: set what it looks up at call time.
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(cache))
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    return repo


def test_a_revision_resolves_to_its_own_snapshot(hub_cache):
    v1, v2 = pin_target("acme/tiny", "v1"), pin_target("acme/tiny", "v2")
    assert (v1.name, v2.name) == ("acme/tiny@v1", "acme/tiny@v2")
    assert v1.path == str(hub_cache / "snapshots" / ("1" * 40))
    assert v2.path == str(hub_cache / "snapshots" / ("2" * 40))
    # What vLLM serves from the snapshot, not only what the trainer reads, is there.
    assert (hub_cache / "snapshots" / ("2" * 40) / "chat_template.jinja").exists()


def test_no_revision_leaves_the_model_as_given(tmp_path):
    assert pin_target("acme/tiny", None) == PinnedTarget("acme/tiny", None, "acme/tiny")
    assert pin_target(str(tmp_path), None).path == str(tmp_path)


def test_a_revision_of_a_local_directory_is_refused(tmp_path):
    with pytest.raises(ValueError, match="is a local directory, and a revision names a version"):
        pin_target(str(tmp_path), "v2")


def _samples(count: int = 2):
    for _ in range(count):
        yield HiddenStateSample(torch.arange(8), torch.ones(8, dtype=torch.bool), torch.zeros(8, 4, 16))


def test_hidden_states_of_one_revision_are_never_extended_with_another(tmp_path):
    fields = {"layer_ids": [0, 1, 2], "num_hidden_layers": 3, "hidden_size": 16, "samples_per_shard": 1}
    v1 = PinnedTarget("acme/tiny", "v1", "unused")
    write_samples(tmp_path, _samples(), target=v1, **fields)
    manifest = json.loads((tmp_path / "manifest.json").read_text())
    assert (manifest["target"], manifest["target_revision"]) == ("acme/tiny", "v1")

    write_samples(tmp_path, _samples(), target=v1, **fields)  # the same revision resumes
    assert read_manifest(tmp_path).num_samples == 4
    with pytest.raises(ValueError, match=r"made from target acme/tiny@v1, this run's target is acme/tiny@v2"):
        write_samples(tmp_path, _samples(), target=PinnedTarget("acme/tiny", "v2", "unused"), **fields)
    with pytest.raises(ValueError, match=r"made from target acme/tiny@v1, this run's target is acme/tiny:"):
        read_manifest(tmp_path).check_target(PinnedTarget("acme/tiny", None, "acme/tiny"), tmp_path)
    assert read_manifest(tmp_path).num_samples == 4  # nothing was appended or lost
