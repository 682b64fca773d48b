"""The pipeline's report: a Markdown table of the evaluated checkpoints and three PNG plots
(acceptance length per domain, per-position acceptance, training curves), under reports/."""

from __future__ import annotations

import json
from pathlib import Path

from eagle3_api.draft_training import DraftTraining
from eagle3_api.workspace import Workspace
from eagle3_runtime.evaluate.evaluations import checkpoint_evaluations
from eagle3_runtime.train.trainer import METRICS_FILE


def _training_metrics(workspace: Workspace) -> list[dict]:
    path = workspace.reports_dir / METRICS_FILE
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _fmt(value, digits: int = 3) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def _plots(workspace: Workspace, evaluations: list[dict], training: list[dict]) -> list[str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out = workspace.reports_dir
    names = []

    domains = sorted({d for e in evaluations for d in e["per_domain"]})
    fig, ax = plt.subplots(figsize=(7, 4))
    width = 0.8 / max(1, len(evaluations))
    for i, evaluation in enumerate(evaluations):
        values = [evaluation["per_domain"].get(d, {}).get("acceptance_length") or 0 for d in domains]
        ax.bar(
            [x + i * width for x in range(len(domains))], values, width, label=f"step {evaluation['step']}"
        )
    ax.set_xticks([x + width * (len(evaluations) - 1) / 2 for x in range(len(domains))], domains)
    ax.set_ylabel("mean acceptance length")
    ax.set_title("Acceptance length per domain (measured in vLLM)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(out / "acceptance-per-domain.png", dpi=100)
    names.append("acceptance-per-domain.png")
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(6, 4))
    for evaluation in evaluations:
        rates = evaluation["acceptance_per_position"]
        ax.plot(range(1, len(rates) + 1), rates, marker="o", label=f"step {evaluation['step']}")
    ax.set_xlabel("speculative position")
    ax.set_ylabel("acceptance rate")
    ax.set_ylim(0, 1)
    ax.set_title("Per-position acceptance (measured in vLLM)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(out / "acceptance-per-position.png", dpi=100)
    names.append("acceptance-per-position.png")
    plt.close(fig)

    fig, (loss_ax, al_ax) = plt.subplots(1, 2, figsize=(10, 4))
    steps = [m["step"] for m in training]
    loss_ax.plot(steps, [m.get("loss") for m in training])
    loss_ax.set_xlabel("step")
    loss_ax.set_ylabel("training loss")
    al_ax.plot(steps, [m.get("simulated_acceptance_length") for m in training], label="simulated (training)")
    al_ax.plot(
        [e["step"] for e in evaluations],
        [e["acceptance_length"] for e in evaluations],
        "o-",
        label="measured (vLLM)",
    )
    al_ax.set_xlabel("step")
    al_ax.set_ylabel("acceptance length")
    al_ax.legend()
    fig.suptitle("Training curves")
    fig.tight_layout()
    fig.savefig(out / "training-curves.png", dpi=100)
    names.append("training-curves.png")
    plt.close(fig)
    return names


def write_report(workspace: Workspace, training: DraftTraining) -> Path:
    evaluations = checkpoint_evaluations(workspace)
    curves = _training_metrics(workspace)
    workspace.reports_dir.mkdir(parents=True, exist_ok=True)
    plots = _plots(workspace, evaluations, curves)
    selection = json.loads(workspace.selection_file.read_text()) if workspace.selection_file.exists() else {}
    spec = training.spec
    k = spec.evaluation.num_speculative_tokens
    epochs = spec.training.epochs
    length = f"{spec.training.total_steps} training steps" if epochs is None else f"{epochs} epochs"
    if epochs is not None and curves:
        length += f" ({curves[-1]['step']} training steps)"
    lines = [
        "# Draft training report",
        "",
        f"Target: `{spec.target.model}`; {spec.data.num_samples} generated samples; {length} "
        f"({spec.training.ttt_steps} TTT steps); hidden states {spec.hidden_states.mode}; evaluated with {k} "
        "speculative tokens, greedy.",
        "",
        "| step | acceptance length | per-position acceptance | tokens/s | speedup | selected |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for e in evaluations:
        per_position = " / ".join(f"{r:.2f}" for r in e["acceptance_per_position"])
        selected = "yes" if e["step"] == selection.get("step") else ""
        lines.append(
            f"| {e['step']} | {_fmt(e['acceptance_length'])} | {per_position} | {_fmt(e['tokens_per_second'], 1)} "
            f"| {_fmt(e.get('speedup'), 2)} | {selected} |"
        )
    best = next((e for e in evaluations if e["step"] == selection.get("step")), None)
    if best:
        lines += [
            "",
            f"Selected step {best['step']}, per domain:",
            "",
            "| domain | acceptance length | prompts |",
            "| --- | --- | --- |",
        ]
        for domain, numbers in sorted(best["per_domain"].items()):
            lines.append(f"| {domain} | {_fmt(numbers['acceptance_length'])} | {numbers['prompts']} |")
    if best and best.get("acceptance_by_context_length"):
        lines += [
            "",
            f"Selected step {best['step']}, per context length (prompts of exactly that many tokens):",
            "",
            "| context length | acceptance length | drafts | prompts |",
            "| --- | --- | --- | --- |",
        ]
        for bucket in best["acceptance_by_context_length"]:
            if bucket.get("unfilled"):
                lines.append(f"| {bucket['context_length']} | not measured: {bucket['unfilled']} | - | 0 |")
                continue
            lines.append(
                f"| {bucket['context_length']} | {_fmt(bucket['acceptance_length'])} | {bucket['drafts']:.0f} "
                f"| {bucket['prompts']} |"
            )
    if best and best.get("baseline_tokens_per_second"):
        when = (
            f", {best['baseline_mode']}, measured {best['baseline_measured_at']}"
            if best.get("baseline_mode")
            else ""
        )
        lines += ["", f"No-speculation baseline: {best['baseline_tokens_per_second']:.1f} tokens/s{when}."]
        if best.get("baseline_mode") == "cached":
            lines.append(
                "The checkpoints share that baseline, so a speedup compares runs made at different times; "
                "`eagle3 evaluate --baseline interleaved` measures both sides back to back."
            )
    lines += ["", *[f"![{name}]({name})" for name in plots], ""]
    path = workspace.reports_dir / "report.md"
    path.write_text("\n".join(lines))
    return path
