"""The stages, in one list: the CRD's stage names, the operator's stage conditions, the `eagle3`
CLI's commands and the order `stage_plan` runs them in all come from `STAGES`."""

from __future__ import annotations

from typing import Literal, NamedTuple


class Stage(NamedTuple):
    name: str
    # The DraftTraining condition type the stage sets when it is done; None: not a DraftTraining stage
    # (a command of its own, never a Job of the operator's).
    condition: str | None
    summary: str  # `eagle3 --help`


STAGES = (
    Stage("generate", "Generated", "regenerate on-policy training data from a vLLM target server"),
    Stage(
        "extract",
        "HiddenStatesExtracted",
        "extract target hidden states: offline shards on disk, or a streaming server for the trainer",
    ),
    Stage("train", "Trained", "train the EAGLE-3 draft head (TTT loss; FSDP2 under torchrun)"),
    Stage(
        "evaluate", "Evaluated", "serve a checkpoint with vLLM speculative decoding and measure acceptance"
    ),
    Stage("select", "Selected", "pick the best checkpoint by measured acceptance length"),
    Stage(
        "sweep",
        "Swept",
        "measure tokens/s at K = 0..Kmax over a ladder of concurrencies -> the per-batch-size K schedule",
    ),
    Stage("export", "Exported", "write a checkpoint as a vLLM-loadable draft directory"),
    Stage("quantize", "Quantized", "quantise an exported draft with AMD Quark (fp8, mxfp4)"),
    Stage("verify", None, "check that a draft changes no greedy output and reaches an acceptance floor"),
    Stage("pipeline", None, "run the whole pipeline on this machine (no cluster)"),
)
# A DraftTraining's stages in the order they run (stage_plan.stages leaves out the ones its spec skips).
TRAINING_STAGES = tuple(stage.name for stage in STAGES if stage.condition)
STAGE_CONDITIONS = {stage.name: stage.condition for stage in STAGES if stage.condition}
# Literal[tuple] is Literal[*tuple]: the types take their values from STAGES too.
TrainingStageName = Literal[TRAINING_STAGES]  # a DraftTraining stage (status.stages[].name)
StageName = Literal[tuple(stage.name for stage in STAGES)]  # any `eagle3 <stage>` (StageResult.stage)
