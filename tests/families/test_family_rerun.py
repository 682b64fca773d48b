"""Re-measure a family of docs/target-families.md (`make test-families`; not in `make test`).

A family's pipeline on its tiny target takes 15 to 30 minutes on a 2-core machine (target build,
generate, extract, train, evaluate in vLLM's CPU build), more than the whole suite's budget allows,
so this test runs on its own, like tests/gpu. What `make test` keeps true without it: the doc is
the matrix of the recorded results (tests/runtime/test_families.py)."""

from __future__ import annotations

import json
import os
from dataclasses import asdict
from pathlib import Path

import pytest

from eagle3_runtime.tiny_families_matrix import RESULTS, recorded_spec, render_matrix, run_family

# Where targets trained off this machine are (OUT of `python -m eagle3_runtime.tiny_families --out
# OUT --device cuda ...`): a row whose target was trained on a GPU is re-measured on that target.
TARGETS_ENV = "EAGLE3_FAMILY_TARGETS"


def _recorded_target(family: str, recorded: dict) -> Path | None:
    """The already built target a GPU-trained row needs (None: the row's target builds here)."""
    device = recorded["target"].get("device", "cpu")
    if device == "cpu":
        return None
    spec = asdict(recorded_spec(recorded))
    flags = " ".join(f"--{k.replace('_', '-')} {spec[k]}" for k in ("steps", "batch_size", "seq_len"))
    build = f"python -m eagle3_runtime.tiny_families {family} --out DIR --device {device} {flags}"
    folder = Path(os.environ.get(TARGETS_ENV, "/nonexistent")) / family
    if not (folder / "tiny_family.json").exists():
        pytest.fail(
            f"{family}'s recorded target was trained on {device}, too long for 2 CPU cores: build it "
            f"there (`{build}`) and set {TARGETS_ENV}=DIR"
        )
    built = json.loads((folder / "tiny_family.json").read_text())
    differs = {k: (built.get(k), v) for k, v in spec.items() if built.get(k) != v}
    assert not differs, f"{folder} is not the recorded target (built, recorded): {differs}"
    return folder


@pytest.mark.slow
@pytest.mark.timeout(3600)
@pytest.mark.parametrize("family", ["qwen3"])
def test_a_fresh_run_measures_what_the_doc_says(family, tmp_path):
    """One family again, its target built with the recorded spec and taken through the recorded
    path (the pipeline, or the Hugging Face side only): its checks and stages, not the measured
    numbers, must be the recorded ones, so the doc's row for it is still true."""
    from eagle3_runtime.pipeline.prompts import write_prompt_sets

    recorded = next(r for r in json.loads(RESULTS.read_text()) if r["family"] == family)
    prompts = tmp_path / "prompts"
    write_prompt_sets(prompts)
    fresh = run_family(
        family,
        tmp_path / family,
        prompts,
        pipeline=bool(recorded["stages"]),
        spec=recorded_spec(recorded),
        target=_recorded_target(family, recorded),
    )
    print(f"\n{family}: measured {fresh['measured']}")
    assert render_matrix([fresh]) == render_matrix([recorded])
