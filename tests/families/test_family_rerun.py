"""Re-measure a family of docs/target-families.md (`make test-families`; not in `make test`).

A family's pipeline on its tiny target takes 15 to 30 minutes on a 2-core machine (target build,
generate, extract, train, evaluate in vLLM's CPU build), more than the whole suite's budget allows,
so this test runs on its own, like tests/gpu. What `make test` keeps true without it: the doc is
the matrix of the recorded results (tests/runtime/test_families.py)."""

from __future__ import annotations

import json

import pytest

from eagle3_runtime.tiny_families_matrix import RESULTS, recorded_spec, render_matrix, run_family


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
        family, tmp_path / family, prompts, pipeline=bool(recorded["stages"]), spec=recorded_spec(recorded)
    )
    print(f"\n{family}: measured {fresh['measured']}")
    assert render_matrix([fresh]) == render_matrix([recorded])
