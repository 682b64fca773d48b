"""The target-family support matrix (docs/target-families.md), measured, not written by hand.

For each family of eagle3_runtime/tiny_families.py:

1. Hugging Face side: the in-process target (`OnlineHiddenStates`, the `online` extraction mode)
   captures the draft's inputs, checked against the model's own `output_hidden_states`; the
   frozen head (`TargetHead`) read from the checkpoint's tensors reproduces the model's logits.
2. `eagle3 pipeline` with a small DraftTraining (`family_manifest`): generate in vLLM's CPU build,
   extract hidden states offline through vLLM, train, evaluate (vLLM serves the target with the
   draft and counts accepted tokens), select, export; then `eagle3 export --format speculators`.
   Where vLLM cannot run the family, the first failing stage and vLLM's own error are recorded.
3. vLLM's states (offline extraction) against the in-process ones on the same tokens.
4. What vLLM's loaders expect: the target architecture implements SupportsEagle3 in vLLM's
   registry, the speculators config passes vLLM's own SpeculatorsConfig reader, and the exported
   tensors and config fit the target (fc width 3 x its hidden size, its vocab_size, layer ids).

`python -m eagle3_runtime.tiny_families_matrix --work DIR` writes `results.json` (every check,
every measured number) and the matrix, whose text depends on the checks only; measured numbers
stay in the results. tests/runtime/test_families.py runs it and compares with the doc.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import yaml

from eagle3_runtime.command_line import flags
from eagle3_runtime.tiny_families import FAMILIES, TinyFamilySpec, ensure_tiny_family, family_spec

log = logging.getLogger(__name__)

DOC = Path(__file__).resolve().parents[1] / "docs" / "target-families.md"
RESULTS = DOC.with_name("target-families-results.json")  # the measured numbers the doc leaves out
PIPELINE_STAGES = ("generate", "extract", "train", "evaluate", "select", "export")
PIPELINE_TIMEOUT_S = 1800
HF_ONLY_STEPS = 10
# Share of the answers long enough to loop that may be one or two tokens repeated (an untrained
# target's output), and share of all answers that may end at once (within LOOP_MIN_TOKENS).
MAX_DEGENERATE_SHARE = 0.25
MAX_ENDED_AT_ONCE_SHARE = 0.5
LOOP_MIN_TOKENS = 8


def family_manifest(name: str) -> dict[str, Any]:
    """A DraftTraining sized for a tiny target on 2 CPU cores: few samples, few steps, one evaluation."""
    return {
        "apiVersion": "eagle3.ai/v1alpha1",
        "kind": "DraftTraining",
        "metadata": {"name": f"family-{name.replace('.', '-')}"},
        "spec": {
            "target": {
                "model": "pvc://models/target",
                "maxModelLen": 1024,
                **({"extraArgs": list(FAMILIES[name].vllm_args)} if FAMILIES[name].vllm_args else {}),
            },
            "data": {
                "sources": [
                    {"claimName": "prompts", "path": "train/chat-continue.jsonl", "mode": "chat"},
                    {"claimName": "prompts", "path": "train/completion-code.jsonl", "mode": "completion"},
                ],
                "numSamples": 96,
                "maxTokens": 96,
                "temperature": 0,
                "topP": 1,
                "concurrency": 4,
                **({"chatTemplateKwargs": {"enable_thinking": True}} if FAMILIES[name].reasoning else {}),
            },
            "hiddenStates": {"mode": "offline"},
            "draft": {"vocabSize": 1024},
            "training": {
                "steps": 120,
                "learningRate": 0.003,
                "batchTokens": 2048,
                "seqLen": 512,
                "tttSteps": 3,
                "checkpointEvery": 120,
            },
            "evaluation": {
                "everyCheckpoints": 1,
                "prompts": [
                    {"claimName": "prompts", "path": "eval/chat-continue.jsonl", "mode": "chat"},
                    {"claimName": "prompts", "path": "eval/completion-code.jsonl", "mode": "completion"},
                ],
                "promptsPerDomain": 4,
                "maxTokens": 64,
                "concurrency": 1,
                "numSpeculativeTokens": 3,
            },
            "storage": {"size": "4Gi"},
        },
    }


def _check(results: dict, name: str, fn, *args) -> Any:
    """Run one check; record ok, or the error it raised (the matrix shows it)."""
    try:
        value = fn(*args)
        results["checks"][name] = {"ok": True}
        return value
    except Exception as exc:  # a failed check is a result, not a crash of the run
        log.exception("%s: %s failed", results["family"], name)
        results["checks"][name] = {"ok": False, "error": f"{type(exc).__name__}: {exc}"[:400]}
        return None


def hf_hidden_states(target: Path, results: dict) -> None:
    """The online mode's capture equals Hugging Face's output_hidden_states; TargetHead's logits
    (read from the checkpoint's own tensors, wherever the wrapper keeps them) equal the model's."""
    import torch

    from eagle3_runtime.model.config import resolve_layer_ids
    from eagle3_runtime.target import (
        OnlineHiddenStates,
        TargetHead,
        load_target_config,
        load_target_embeddings,
    )

    config = load_target_config(str(target))
    layer_ids = resolve_layer_ids("auto", config.num_hidden_layers)
    online = OnlineHiddenStates(str(target), layer_ids)
    ids = torch.arange(3, 67) % config.vocab_size
    states = online(ids)
    with torch.no_grad():
        out = online.model(input_ids=ids[None], output_hidden_states=True, use_cache=False)
    reference = out.hidden_states
    for column, layer in enumerate(layer_ids):
        torch.testing.assert_close(states[:, column], reference[layer][0], msg=f"layer {layer}")
    head = TargetHead.from_pretrained(str(target), config)
    torch.testing.assert_close(head(states[:, 3]).float(), out.logits[0].float(), atol=2e-2, rtol=2e-2)
    embeddings = load_target_embeddings(str(target), config)
    torch.testing.assert_close(
        embeddings.float(), online.model.get_input_embeddings().weight[: config.vocab_size].float()
    )
    results["measured"]["hidden_size"] = states.shape[-1]
    results["layer_ids"] = layer_ids


def run_pipeline(name: str, target: Path, work: Path, prompts: Path, results: dict) -> None:
    """`eagle3 pipeline` in a subprocess; each stage's result file says how far it got."""
    models = work / "models"
    models.mkdir(parents=True, exist_ok=True)
    link = models / "target"
    if link.is_symlink():
        link.unlink()
    link.symlink_to(target, target_is_directory=True)
    manifest = work / "manifest.yaml"
    manifest.write_text(yaml.safe_dump(family_manifest(name), sort_keys=False))
    workspace = work / "ws"
    command = [sys.executable, "-m", "eagle3_runtime.cli", "pipeline"]
    command += flags({"--config": manifest, "--workspace": workspace})
    command += ["--volume", f"models={models}", "--volume", f"prompts={prompts}"]
    command += flags({"--result-file": work / "result.json"})
    started = time.monotonic()
    with (work / "pipeline.log").open("w") as out:
        subprocess.run(command, stdout=out, stderr=subprocess.STDOUT, timeout=PIPELINE_TIMEOUT_S, check=False)
    results["measured"]["pipeline_seconds"] = round(time.monotonic() - started, 1)
    record_stages(work, results)


def record_stages(work: Path, results: dict) -> None:
    """Each stage's outcome from the pipeline's files in `work`, and the acceptance measured."""
    workspace = work / "ws"
    # A stage that raised wrote no result of its own: the pipeline's result says why it stopped.
    pipeline_result = work / "result.json"
    stopped = json.loads(pipeline_result.read_text()) if pipeline_result.exists() else {}
    for stage in PIPELINE_STAGES:
        path = workspace / "results" / f"{stage}.json"
        if not path.exists():
            if stopped and not stopped.get("ok", True):
                results["stages"][stage] = {
                    "ok": False,
                    "error": stopped.get("message", "")[:400],
                    "vllm_error": vllm_error(workspace / "logs"),
                }
                stopped = {}  # the stages after it were not reached
            else:
                results["stages"][stage] = {"ok": False, "error": "not reached"}
            continue
        stage_result = json.loads(path.read_text())
        entry = {"ok": bool(stage_result.get("ok", True))}
        if not entry["ok"]:
            stopped = {}  # this stage says why it failed; the pipeline stopped after it
            entry["error"] = stage_result.get("message", "")[:400]
            entry["vllm_error"] = vllm_error(workspace / "logs")
        results["stages"][stage] = entry
    evaluations = sorted((workspace / "evaluations").glob("step-*.json"))
    if evaluations:
        best = json.loads(evaluations[-1].read_text())
        results["measured"].update(
            acceptance_length=round(best["acceptance_length"], 3),
            acceptance_per_position=[round(p, 3) for p in best["acceptance_per_position"]],
            evaluated_step=best["step"],
        )


def outputs_have_structure(work: Path, results: dict) -> None:
    """The target's generated answers are not one token repeated (acceptance of such a target is
    trivially perfect and says nothing about the draft), and most say something (an answer that
    ends at once, its stop token only, gives the draft nothing to learn or to be measured on)."""
    from eagle3_runtime.conversations import iter_records

    answers = []
    for record in iter_records(work / "ws" / "data"):
        answers += [g["completion_token_ids"] for g in record.generations or []]
        answers += [record.completion_token_ids] if record.completion_token_ids else []
    long_enough = [a for a in answers if len(a) >= LOOP_MIN_TOKENS]
    degenerate = sum(len(set(a)) <= 2 for a in long_enough) / max(1, len(long_enough))
    ended_at_once = 1 - len(long_enough) / max(1, len(answers))
    distinct = sum(len(set(a)) / len(a) for a in answers if a) / max(1, len(answers))
    results["measured"].update(
        degenerate_answer_share=round(degenerate, 3),
        ended_at_once_share=round(ended_at_once, 3),
        distinct_token_ratio=round(distinct, 3),
    )
    if degenerate > MAX_DEGENERATE_SHARE:
        raise AssertionError(
            f"{degenerate:.0%} of the target's answers of {LOOP_MIN_TOKENS}+ tokens repeat one or two tokens"
        )
    if ended_at_once > MAX_ENDED_AT_ONCE_SHARE:
        raise AssertionError(
            f"{ended_at_once:.0%} of the target's answers end within {LOOP_MIN_TOKENS} tokens"
        )


def vllm_serves_with_a_draft(name: str, target: Path, work: Path, results: dict) -> None:
    """For a family not taken through the pipeline: one vLLM start serving the target with an
    untrained draft exported for it (acceptance means nothing then; serving at all is the check),
    and one request."""
    import httpx

    from eagle3_runtime.export import write_eagle3_dir
    from eagle3_runtime.model.config import draft_config_from_target
    from eagle3_runtime.model.draft import Eagle3Draft, init_weights
    from eagle3_runtime.target import load_target_config
    from eagle3_runtime.vllm_server import VLLMServer

    config = load_target_config(str(target))
    draft = Eagle3Draft(
        draft_config_from_target(config, layer_ids="auto", draft_vocab_size=config.vocab_size)
    )
    init_weights(draft, seed=0)
    directory = write_eagle3_dir(work / "untrained-draft", draft.trainable_state_dict(), draft.config)
    speculative = {"method": "eagle3", "model": str(directory), "num_speculative_tokens": 3}
    logs = work / "logs"
    with VLLMServer(
        target,
        log_path=logs / "probe-vllm.log",
        speculative_config=speculative,
        extra_args=FAMILIES[name].vllm_args,
    ) as server:
        reply = httpx.post(
            f"{server.url}/v1/completions",
            timeout=300,
            json={"model": str(target), "prompt": "def main(", "max_tokens": 16, "temperature": 0},
        )
        reply.raise_for_status()
        results["measured"]["probe_completion"] = reply.json()["choices"][0]["text"]


# vLLM's own wrappers around the error that stopped it: the line before them is the cause.
GENERIC_VLLM_ERRORS = (
    "Engine core initialization failed",
    "WorkerProc initialization failed",
    "Worker failed with error '',",  # the worker's exception had no message: the line above says it
    "EngineCore encountered an issue",
)


# A line of a vLLM log: the process and log-record prefix vLLM may put before it, then the text.
_LOG_PREFIX = r"^(?:\(\w+ pid=\d+\) )?(?:ERROR [\d-]+ [\d:]+ \[[^\]]+\] )?"
_EXCEPTION_WITH_MESSAGE = re.compile(_LOG_PREFIX + r"(\w+(?:\.\w+)*(?:Error|Exception)): (.+)$")
_BARE_EXCEPTION = re.compile(_LOG_PREFIX + r"(\w+(?:\.\w+)*(?:Error|Exception))$")
_TRACEBACK_FRAME = re.compile(_LOG_PREFIX + r'\s*File "(?:.*/site-packages/)?([^"]+)", line (\d+)')


def vllm_error(logs: Path) -> str | None:
    """The exception that stopped vLLM, in its own words (the support table quotes them): the last
    one logged that is not one of vLLM's generic wrappers, from a process's traceback or its
    `ERROR [file:line]` log line. A bare exception (an `assert` that failed) is quoted with the
    source line that raised it and where that line is."""
    found = None
    for log_file in sorted(logs.glob("*vllm*.log"), key=lambda p: p.stat().st_mtime):
        lines = [line.strip() for line in log_file.read_text(errors="replace").splitlines()]
        for number, line in enumerate(lines):
            match = _EXCEPTION_WITH_MESSAGE.match(line)
            if match and not match.group(2).startswith(GENERIC_VLLM_ERRORS):
                found = f"{match.group(1)}: {match.group(2)}"[:300]
            elif (match := _BARE_EXCEPTION.match(line)) and (cause := _raising_line(lines[:number])):
                found = f"{match.group(1)}: {cause}"[:300]
    return found


def _raising_line(before: list[str]) -> str | None:
    """The traceback's last frame above a bare exception: its source line, module and line number
    (a module name, not a path: the doc drops paths as run-specific)."""
    source = None
    for line in reversed(before):
        if (where := _TRACEBACK_FRAME.match(line)) is not None:
            module = where.group(1).removesuffix(".py").replace("/", ".")
            return f"{source} ({module}, line {where.group(2)})" if source else None
        text = re.sub(_LOG_PREFIX, "", line).strip()
        if text and set(text) - set("^~ "):  # not the caret line under the source
            source = text
    return None


def offline_matches_online(target: Path, work: Path, results: dict) -> None:
    """vLLM's extracted states (offline mode) against the in-process target's on the same tokens."""
    import torch

    from eagle3_runtime.hidden_states import iter_shard_samples, read_manifest
    from eagle3_runtime.target import OnlineHiddenStates

    directory = work / "ws" / "hidden-states"
    manifest = read_manifest(directory)
    sample = next(iter_shard_samples(directory))
    online = OnlineHiddenStates(str(target), manifest.layer_ids)
    expected = online(sample.input_ids).float()
    got = sample.hidden_states.float()
    error = ((got - expected).norm(dim=-1) / expected.norm(dim=-1).clamp_min(1e-6)).max().item()
    results["measured"]["offline_vs_online_relative_error"] = round(error, 4)
    if error > 0.1:  # bf16 kernels differ; a wrong layer or a shifted position is off by far more
        raise AssertionError(f"vLLM's states differ from the in-process target's by {error:.3f} (relative)")
    del torch


def export_draft(target: Path, work: Path, fmt: str, checkpoint: str) -> Path:
    """`eagle3 export` of `checkpoint` (best, or step-N) in format `fmt`; the published folder."""
    out = work / f"export-{fmt}-{checkpoint}"
    command = [sys.executable, "-m", "eagle3_runtime.cli", "export"]
    command += flags(
        {
            "--workspace": work / "ws",
            "--checkpoint": checkpoint,
            "--format": fmt,
            "--output": out,
            "--target": target,
        }
    )
    run = subprocess.run(command, capture_output=True, text=True, timeout=600, check=False)
    if run.returncode != 0:
        raise RuntimeError(run.stdout[-400:] + run.stderr[-400:])
    return out / "latest"


def last_checkpoint(work: Path) -> str | None:
    """step-N of the last complete training checkpoint in the family's workspace (None: none)."""
    from eagle3_api.workspace import Workspace
    from eagle3_runtime.train.checkpoint import complete_checkpoints

    steps = complete_checkpoints(Workspace(work / "ws"))
    return f"step-{steps[-1]}" if steps else None


def vllm_loader_expectations(
    name: str, target: Path, work: Path, results: dict, checkpoint: str = "best"
) -> None:
    """Both exports of `checkpoint` against what vLLM reads: the target architecture's SupportsEagle3
    in vLLM's registry, its speculators config reader, and tensor names and shapes that fit the
    target. `best` is the pipeline's own export (and the speculators format of the same step)."""
    from safetensors import safe_open
    from vllm.model_executor.models.interfaces import supports_eagle3
    from vllm.model_executor.models.registry import ModelRegistry
    from vllm.transformers_utils.configs.speculators.base import SpeculatorsConfig

    from eagle3_runtime.target import load_target_config

    family = FAMILIES[name]
    model_cls = ModelRegistry._try_load_model_cls(family.architecture)  # the class vLLM serves it with
    if model_cls is None:
        raise AssertionError(f"vLLM's registry has no {family.architecture}")
    if not supports_eagle3(model_cls):
        raise AssertionError(f"vLLM's {model_cls.__name__} does not implement SupportsEagle3")
    target_config = load_target_config(str(target))
    exports = {
        "eagle3": work / "ws" / "export" / "latest"
        if checkpoint == "best"
        else export_draft(target, work, "eagle3", checkpoint),
        "speculators": export_draft(target, work, "speculators", checkpoint),
    }
    for fmt, directory in exports.items():
        raw = json.loads((directory / "config.json").read_text())
        if fmt == "speculators":
            verifier = raw["speculators_config"]["verifier"]
            if verifier["architectures"] != [family.architecture]:
                raise AssertionError(
                    f"speculators verifier {verifier} is not the {family.architecture} target"
                )
            config = SpeculatorsConfig.extract_transformers_pre_trained_config(json.loads(json.dumps(raw)))
            prefix = "layers.0."
        else:
            config, prefix = raw, "midlayer."
        if config["architectures"][0] not in ("LlamaForCausalLMEagle3", "Eagle3LlamaForCausalLM"):
            raise AssertionError(f"{fmt}: draft architecture {config['architectures']}")
        if config["vocab_size"] != target_config.vocab_size:
            raise AssertionError(
                f"{fmt}: vocab_size {config['vocab_size']} != the target's {target_config.vocab_size}"
            )
        layer_ids = config["eagle_aux_hidden_state_layer_ids"]
        if len(set(layer_ids)) != 3 or not all(0 <= i < target_config.num_hidden_layers for i in layer_ids):
            raise AssertionError(f"{fmt}: layer ids {layer_ids} for {target_config.num_hidden_layers} layers")
        with safe_open(str(directory / "model.safetensors"), framework="pt") as handle:
            names = handle.keys()
            shapes = {k: tuple(handle.get_slice(k).get_shape()) for k in names}
        hidden = target_config.hidden_size
        expected = {
            "fc.weight": (hidden, 3 * hidden),
            "norm.weight": (hidden,),
            "lm_head.weight": (config["draft_vocab_size"], hidden),
            f"{prefix}hidden_norm.weight": (hidden,),
            f"{prefix}input_layernorm.weight": (hidden,),
        }
        for tensor, shape in expected.items():
            if shapes.get(tensor) != shape:
                raise AssertionError(f"{fmt}: {tensor} is {shapes.get(tensor)}, vLLM expects {shape}")
        if config["draft_vocab_size"] < target_config.vocab_size and shapes.get("d2t") != (
            config["draft_vocab_size"],
        ):
            raise AssertionError(f"{fmt}: d2t missing for a draft vocabulary smaller than the target's")
        if any(k.startswith("embed_tokens") for k in shapes):
            raise AssertionError(f"{fmt}: carries embed_tokens (vLLM shares the target's)")


def run_family(
    name: str,
    work: Path,
    prompts: Path,
    *,
    pipeline: bool = True,
    target: Path | None = None,
    spec: TinyFamilySpec | None = None,
    serve_probe: bool = False,
) -> dict:
    """One family's row: its checks and stages, and what was measured. `target`: an already built
    one; `spec`: build this one (default: the family's, with few steps for a Hugging Face-only row)."""
    work.mkdir(parents=True, exist_ok=True)
    results: dict[str, Any] = _empty_row(name)
    started = time.monotonic()
    # The Hugging Face-side checks hold for any weights: a family checked only there is built briefly.
    spec = spec or (family_spec(name) if pipeline else family_spec(name, steps=HF_ONLY_STEPS))
    if target is None:
        target = _check(results, "build", ensure_tiny_family, name, spec)
    else:
        results["checks"]["build"] = {"ok": (target / "config.json").exists()}
    if target is not None:
        results["target"] = json.loads((target / "tiny_family.json").read_text())
    if target is None:
        return results
    _check(results, "hf_hidden_states", hf_hidden_states, target, results)
    if serve_probe:
        _check(results, "vllm_serves_with_a_draft", vllm_serves_with_a_draft, name, target, work, results)
        if not results["checks"]["vllm_serves_with_a_draft"]["ok"]:
            results["checks"]["vllm_serves_with_a_draft"]["vllm_error"] = vllm_error(work / "logs")
    if pipeline:
        _check(results, "pipeline_ran", run_pipeline, name, target, work, prompts, results)
        if results["stages"].get("generate", {}).get("ok"):
            _check(results, "target_outputs_have_structure", outputs_have_structure, work, results)
        if results["stages"].get("extract", {}).get("ok"):
            _check(results, "offline_matches_online", offline_matches_online, target, work, results)
        if results["stages"].get("export", {}).get("ok"):
            _check(results, "vllm_loader_expectations", vllm_loader_expectations, name, target, work, results)
        elif results["stages"].get("train", {}).get("ok") and (last := last_checkpoint(work)):
            # The pipeline stopped after training (vLLM could not evaluate): what it trained is
            # still exported and checked against vLLM's loaders, and the row says so.
            results["measured"]["exported_checkpoint"] = last
            _check(
                results,
                "vllm_loader_expectations",
                vllm_loader_expectations,
                name,
                target,
                work,
                results,
                last,
            )
    results["measured"]["seconds"] = round(time.monotonic() - started, 1)
    results["supported"] = supported(results)
    return results


def supported(results: dict) -> bool:
    """Every check passed and every stage ran."""
    return (
        all(c["ok"] for c in results["checks"].values())
        and len(results["stages"]) == len(PIPELINE_STAGES)
        and all(s["ok"] for s in results["stages"].values())
    )


def recheck(results: list[dict], work: Path) -> list[dict]:
    """The recorded rows with the checks that read only a run's files done again on those files
    (stage outcomes, the target's answers), for rows whose run's folder is still in `work`: a
    check changed, the pipeline did not run again. The measured seconds stay the run's."""
    for row in results:
        folder = work / row["family"]
        if not row["stages"] or not (folder / "ws").is_dir():
            continue
        record_stages(folder, row)
        row["checks"].pop("target_outputs_have_structure", None)
        if row["stages"]["generate"]["ok"]:
            _check(row, "target_outputs_have_structure", outputs_have_structure, folder, row)
        row["supported"] = supported(row)
    return results


def recorded_spec(result: dict) -> TinyFamilySpec:
    """The spec a recorded row's target was built with (to build the same one again)."""
    fields = {k: v for k, v in result["target"].items() if k in TinyFamilySpec.__dataclass_fields__}
    return TinyFamilySpec(**fields)


def _empty_row(name: str) -> dict[str, Any]:
    family = FAMILIES[name]
    return {
        "family": name,
        "architecture": family.architecture,
        "reasoning": family.reasoning,
        "checks": {},
        "stages": {},
        "measured": {},
    }


def not_run(name: str) -> dict:
    return {**_empty_row(name), "supported": False}


MARK = {True: "yes", False: "**no**"}


def render_matrix(results: list[dict]) -> str:
    """docs/target-families.md from the results (checks and stages only: no measured numbers)."""
    lines = [
        "# Target families",
        "",
        "<!-- Generated by `python -m eagle3_runtime.tiny_families_matrix` from a run; "
        "tests/runtime/test_families.py keeps it true. Do not edit by hand. -->",
        "",
        "Tiny instances of each family are built on this machine (`eagle3_runtime/tiny_families.py`: the",
        "family's Hugging Face config class, a locally trained tokenizer, the family's chat shape with its",
        "reasoning block, brief training) and taken through `eagle3 pipeline` on vLLM's CPU build. A family",
        "is **supported** only when every stage ran in vLLM and every check passed. Measured numbers",
        "(acceptance length, per-position rates, seconds, the offline/online hidden-state error) are in",
        "`docs/target-families-results.json`, written by the same run.",
        "",
        "Columns: *HF hidden states* is the `online` extraction mode (the target in the trainer's",
        "process) checked against Hugging Face's `output_hidden_states` and logits; *extract* is the",
        "`offline` mode through vLLM; *target outputs have structure* checks the target's generated",
        f"answers (greedy): of those of {LOOP_MIN_TOKENS} tokens or more, at most {MAX_DEGENERATE_SHARE:.0%}"
        " are one or two tokens repeated",
        f"(acceptance on such a target means nothing), and at most {MAX_ENDED_AT_ONCE_SHARE:.0%} of all"
        f" end within {LOOP_MIN_TOKENS} tokens",
        "(nothing to learn from); *vLLM states =",
        "HF states* compares the two extraction paths on the same tokens; *export fits vLLM's loader*",
        "checks both export formats against vLLM's SpeculatorsConfig reader, the target class's",
        "SupportsEagle3 in vLLM's registry, and the tensor shapes the target implies. The `streaming`",
        "mode uses the same vLLM extraction as `offline` and is not repeated per family. *not run* /",
        "*not measured*: the recorded run did not take that family or stage through. *vLLM serves it",
        "with an untrained draft*: one vLLM start with the target and an EAGLE-3 draft made for it, and",
        "one request, for a family not taken through the pipeline. *not reached*: the pipeline stopped",
        "at an earlier stage; where training had run, its last checkpoint is exported by `eagle3 export`",
        "alone and checked against vLLM's loaders (*last checkpoint exported*). A family checked on",
        "the Hugging Face side only is built with few training steps (those checks do not need a trained",
        "target). A step count marked *(cuda)*: that target was trained on a GPU (`python -m",
        "eagle3_runtime.tiny_families --out DIR --device cuda ...`, its spec in the results file), long",
        "enough for its answers to have structure, which 2 CPU cores cannot do in a session; everything",
        "after the build ran here.",
        "",
        "| family | architecture | target training steps | supported | HF hidden states | "
        + " | ".join(PIPELINE_STAGES)
        + " | vLLM serves it with an untrained draft | target outputs have structure | vLLM states = HF states | export fits vLLM's loader |",
        "|---" * (9 + len(PIPELINE_STAGES)) + "|",
    ]
    errors = []
    for r in results:
        checks, stages = r["checks"], r["stages"]

        def cell(entry: dict | None) -> str:
            if entry is None:
                return "not run"
            return "not reached" if entry.get("error") == "not reached" else MARK[entry["ok"]]

        row = [
            r["family"],
            f"`{r['architecture']}`",
            _target_steps(r.get("target")),
            MARK[r["supported"]] if checks else "not measured",
            cell(checks.get("hf_hidden_states")),
        ]
        row += [cell(stages.get(s)) for s in PIPELINE_STAGES]
        if "exported_checkpoint" in r["measured"]:  # the pipeline stopped; `eagle3 export` ran alone
            row[-1] += " (last checkpoint exported)"
        row += [
            cell(checks.get(c))
            for c in (
                "vllm_serves_with_a_draft",
                "target_outputs_have_structure",
                "offline_matches_online",
                "vllm_loader_expectations",
            )
        ]
        lines.append("| " + " | ".join(row) + " |")
        for stage, entry in [*stages.items(), *checks.items()]:
            if not entry["ok"] and entry.get("error") != "not reached":
                said = entry.get("vllm_error") or entry.get("error")
                errors.append(f"- **{r['family']}**, {stage}: `{_normalise(said)}`")
    if errors:
        lines += ["", "## What failed, in the failing tool's own words", "", *errors]
    return "\n".join(lines) + "\n"


def _target_steps(target: dict | None) -> str:
    """The target's training steps, and where they ran when not on this machine's CPU."""
    if target is None:
        return "-"
    device = target.get("device", "cpu")
    return str(target["steps"]) if device == "cpu" else f"{target['steps']} ({device})"


def _normalise(text: str) -> str:
    """Drop run-specific parts (paths, ports, addresses) so the doc compares across runs."""
    text = re.sub(r"/[\w./+-]*", "<path>", text)
    text = re.sub(r"\b\d{4,5}\b", "<n>", text)
    return text.replace("`", "'")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--work", type=Path, required=True, help="a scratch folder (one subfolder per family)"
    )
    parser.add_argument("--families", nargs="*", default=list(FAMILIES), help="through the whole pipeline")
    parser.add_argument(
        "--serve-probe",
        nargs="*",
        default=[],
        help="families (of --hf-only) that vLLM serves once with an untrained draft",
    )
    parser.add_argument("--hf-only", nargs="*", default=[], help="Hugging Face side only (no vLLM)")
    parser.add_argument(
        "--target",
        action="append",
        default=[],
        metavar="FAMILY=DIR",
        help="an already built target of the family instead of building one",
    )
    parser.add_argument("--merge", action="store_true", help="keep the results file's other families")
    parser.add_argument("--results", type=Path, default=RESULTS)
    parser.add_argument("--doc", type=Path, default=DOC)
    parser.add_argument("--render-only", action="store_true", help="rewrite the doc from the results file")
    parser.add_argument(
        "--recheck",
        action="store_true",
        help="do the checks that read a run's files again on the recorded runs' folders in --work "
        "(stage outcomes, the target's answers), then rewrite the results and the doc",
    )
    parser.add_argument(
        "--combine",
        nargs="*",
        type=Path,
        default=[],
        help="results files of runs made side by side: a family measured in a later file "
        "replaces the earlier row; the combination is written to --results and --doc",
    )
    args = parser.parse_args(argv)
    if args.combine:
        rows = {name: not_run(name) for name in FAMILIES}
        for path in args.combine:
            rows.update({r["family"]: r for r in json.loads(path.read_text()) if r["checks"]})
        for name, row in rows.items():  # the probes' vLLM logs read again with this module's reader
            probe = row["checks"].get("vllm_serves_with_a_draft")
            if probe and not probe["ok"] and (args.work / name / "logs").is_dir():
                probe["vllm_error"] = vllm_error(args.work / name / "logs")
        args.results.write_text(json.dumps(list(rows.values()), indent=2) + "\n")
    if args.recheck:
        rows = recheck(json.loads(args.results.read_text()), args.work)
        args.results.write_text(json.dumps(rows, indent=2) + "\n")
    if args.render_only or args.combine or args.recheck:
        args.doc.write_text(render_matrix(json.loads(args.results.read_text())))
        return 0
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    from eagle3_runtime.pipeline.prompts import write_prompt_sets

    prompts = args.work / "prompts"
    write_prompt_sets(prompts)
    targets = {name: Path(folder) for name, _, folder in (t.partition("=") for t in args.target)}
    results = {name: not_run(name) for name in FAMILIES}  # every family gets a row
    # The quick Hugging Face-side families first, so a long pipeline cannot hold them up; the doc and
    # the results are rewritten after each family, so they always agree.
    for name in [*args.hf_only, *(f for f in args.families if f not in args.hf_only)]:
        results[name] = run_family(
            name,
            args.work / name,
            prompts,
            pipeline=name not in args.hf_only,
            serve_probe=name in args.serve_probe,
            target=targets.get(name),
        )
        if args.merge and args.results.exists():  # another run's families stay as it recorded them
            recorded = {r["family"]: r for r in json.loads(args.results.read_text())}
            results = {**recorded, **{n: r for n, r in results.items() if r["checks"]}}
            results = {n: results.get(n, not_run(n)) for n in FAMILIES}
        args.results.write_text(json.dumps(list(results.values()), indent=2) + "\n")
        args.doc.write_text(render_matrix(list(results.values())))
    return 0


if __name__ == "__main__":
    sys.exit(main())
