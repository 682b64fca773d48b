"""DraftTraining: trains, evaluates and exports an EAGLE-3 draft for a target model."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field, model_validator

from eagle3_api.base import FREE_FORM_OBJECT, ApiModel, DnsName, Quantity, StringMap, cel, section
from eagle3_api.common import (
    CONDITIONS_FIELD,
    Condition,
    EnvList,
    ImagePullSecrets,
    ModelRef,
    NetworkPolicySpec,
    Phase,
    PodSecuritySpec,
    Quantization,
    SchedulingSpec,
    TargetSpec,
    env_field,
    image_pull_secrets_field,
)
from eagle3_api.progress import Progress
from eagle3_api.stages import TrainingStageName

KIND = "DraftTraining"
PLURAL = "drafttrainings"
DEFAULT_RUNTIME_IMAGE = "ghcr.io/eagle3-ai/eagle3-runtime:0.1.0"
DEFAULT_STEPS = 2000
MAX_DRAFT_LAYERS = 4  # the runtime's bound too (eagle3_runtime.model.config)
RelativePath = Annotated[str, Field(min_length=1, max_length=1024, pattern=r"^[^/\s][^\s]*$")]


class RuntimeSpec(ApiModel):
    """The image and identity of the stage pods (`eagle3 <stage>`)."""

    image: Annotated[str, Field(min_length=1, max_length=512)] = Field(
        DEFAULT_RUNTIME_IMAGE, description="eagle3 runtime image that runs every stage."
    )
    image_pull_policy: Literal["Always", "IfNotPresent", "Never"] = Field(
        "IfNotPresent", description="Image pull policy of the stage pods."
    )
    service_account_name: DnsName | None = Field(
        None,
        description="ServiceAccount of the stage pods (needs to patch its own pod for progress reports).",
    )
    backoff_limit: Annotated[int, Field(ge=0, le=10)] = Field(
        2, description="Retries of a failed stage pod before the stage, and the training, fail."
    )
    stage_deadline_seconds: Annotated[int, Field(ge=60, le=31_536_000)] | None = Field(
        None,
        description="Deadline of each stage Job, from its start (the Job's activeDeadlineSeconds): a stage "
        "still running, or whose pods still cannot be scheduled or started, after this long fails the "
        "training with reason DeadlineExceeded. No deadline when unset.",
    )


class PromptSource(ApiModel):
    """Prompts on a PVC: a JSONL or Parquet file, or a dataset directory of them."""

    claim_name: DnsName = Field(description="PVC holding the prompts; mounted read-only.")
    path: RelativePath = Field(description="Path of the file or dataset directory inside the PVC.")
    mode: Literal["chat", "completion"] = Field(
        "chat",
        description="chat: /v1/chat/completions with the chat template; completion: raw /v1/completions.",
    )
    prompt_field: Annotated[str, Field(max_length=128)] | None = Field(
        None, description="Field holding the prompt (completion mode)."
    )
    messages_field: Annotated[str, Field(max_length=128)] | None = Field(
        None, description="Field holding the conversation (chat mode)."
    )


class DataSource(PromptSource):
    """A dataset directory or JSONL file on a PVC, whose prompts the target answers."""

    weight: Annotated[float, Field(gt=0, le=1000)] = Field(1.0, description="Relative share of the samples.")
    tools_field: Annotated[str, Field(max_length=128)] | None = Field(
        None,
        description="Field holding the conversation's tool definitions (chat mode; default `tools`), sent "
        "with every request of that conversation.",
    )


class DataSpec(ApiModel):
    """Data generation: the target answers the prompts, so the draft learns the target's own outputs."""

    sources: Annotated[list[DataSource], Field(min_length=1, max_length=16)] = Field(
        description="Prompt sources (at least one)."
    )
    num_samples: Annotated[int, Field(ge=1, le=10_000_000)] = Field(
        5000, description="Conversations to generate."
    )
    max_tokens: Annotated[int, Field(ge=1, le=131072)] = Field(1024, description="Max new tokens per answer.")
    temperature: Annotated[float, Field(ge=0, le=2)] = Field(0.7, description="Sampling temperature.")
    top_p: Annotated[float, Field(gt=0, le=1)] = Field(0.95, description="Nucleus sampling top-p.")
    concurrency: Annotated[int, Field(ge=1, le=4096)] = Field(
        64, description="Concurrent requests to the target."
    )
    seed: Annotated[int, Field(ge=0)] = Field(0, description="Seed for sampling and shuffling.")
    on_bad_row: Literal["skip", "fail"] = Field("skip", description="What to do with a malformed source row.")
    regenerate_turns: Literal["all", "last"] = Field(
        "all",
        description="Chat sources: regenerate every assistant turn in order, each conditioned on the turns "
        "generated before it (all), or only the reply to the last user or tool message (last).",
    )
    chat_template_kwargs: dict[str, Any] | None = Field(
        None,
        description='Passed to the chat template with every chat request, e.g. {"enable_thinking": true}.',
        json_schema_extra={**FREE_FORM_OBJECT, "maxProperties": 32},
    )
    max_length: Annotated[int, Field(ge=16, le=1_048_576)] = Field(
        2047, description="Tokens per training sequence at most (prompt and generated turns)."
    )
    long_samples: Literal["truncate", "skip"] = Field(
        "truncate",
        description="A sample over maxLength is cut there (truncate) or left out (skip); either way it is "
        "listed with its source row and counted.",
    )


class HiddenStatesSpec(ApiModel):
    """How the trainer gets the target's hidden states."""

    mode: Literal["offline", "online", "streaming"] = Field(
        "offline",
        description="offline: an extraction Job writes them to the workspace; online: the trainer runs the "
        "target itself; streaming: the trainer reads them from the target vLLM server.",
    )
    layer_ids: (
        Annotated[list[Annotated[int, Field(ge=0, le=1024)]], Field(min_length=3, max_length=3)] | None
    ) = Field(
        None,
        description="Three distinct target layer ids (low, mid, high) whose input states feed the draft; "
        "chosen from the target's depth when unset.",
        json_schema_extra={"x-kubernetes-list-type": "set"},
    )


class DraftInitialization(ApiModel):
    """Where the draft's weights start."""

    model_config = ApiModel.model_config | {
        "json_schema_extra": {
            "x-kubernetes-validations": [
                cel(
                    # has(): the section's default ({}) is checked before its fields are defaulted.
                    "(has(self.from) && self.from == 'checkpoint') == has(self.path)",
                    "path is required when from is checkpoint, and only then",
                    field_path=".path",
                )
            ]
        }
    }

    source: Literal["scratch", "checkpoint"] = Field(
        "scratch",
        alias="from",
        description="scratch: random decoder layers; checkpoint: warm start from an existing EAGLE-3 draft "
        "(for example a published head, fine-tuned on the target's own outputs).",
    )
    path: ModelRef | None = Field(
        None,
        description="The draft to start from (from: checkpoint): a Hugging Face id or pvc://CLAIM/PATH of a "
        "plain eagle3 or speculators-format directory with model.safetensors (an exported draft, or a "
        "checkpoint such as pvc://WORKSPACE/checkpoints/step-00001000). Its layers must match draft.layers "
        "and the target's width; lm_head rows are kept for the tokens both vocabularies share. The "
        "embeddings are always the target's.",
    )

    @model_validator(mode="after")
    def _path_iff_checkpoint(self) -> DraftInitialization:
        if (self.source == "checkpoint") != (self.path is not None):
            raise ValueError("draft.initialization.path is required when from is checkpoint, and only then")
        return self


class DraftSpec(ApiModel):
    """The draft model's shape and starting point."""

    vocab_size: Annotated[int, Field(ge=256, le=1_048_576)] = Field(
        32000, description="Draft vocabulary: the most frequent target tokens of the generated answers."
    )
    layers: Annotated[int, Field(ge=1, le=MAX_DRAFT_LAYERS)] = Field(
        1,
        description="Decoder layers of the EAGLE-3 head (1 is the published EAGLE-3 shape; more layers "
        "predict better but draft slower).",
    )
    initialization: DraftInitialization = section(
        DraftInitialization, "Initial weights: from scratch (default) or from an existing draft."
    )


class TrainingSpec(ApiModel):
    """Training (FSDP2 over nodes x GPUs per node). Its length is steps or epochs, not both;
    with neither, DEFAULT_STEPS steps."""

    model_config = ApiModel.model_config | {
        "json_schema_extra": {
            "x-kubernetes-validations": [
                cel(
                    "!(has(self.steps) && has(self.epochs))",
                    "set steps or epochs, not both",
                    field_path=".epochs",
                ),
                cel(
                    # has(): the API server checks the section's default ({}) before its fields are defaulted.
                    f"!has(self.checkpointEvery) || has(self.epochs) || "
                    f"self.checkpointEvery <= (has(self.steps) ? self.steps : {DEFAULT_STEPS})",
                    "checkpointEvery must not exceed steps",
                    field_path=".checkpointEvery",
                ),
            ]
        }
    }

    # No schema default: a defaulted steps would collide with a given epochs.
    steps: Annotated[int, Field(ge=1, le=10_000_000)] | None = Field(
        None, description=f"Optimizer steps; {DEFAULT_STEPS} when neither steps nor epochs is set."
    )
    epochs: Annotated[int, Field(ge=1, le=10_000)] | None = Field(
        None,
        description="Passes over the training data instead of steps: the trainer derives the step count from "
        "the data's size (packed rows / rows per step) and reports it as status.progress.totalSteps.",
    )
    learning_rate: Annotated[float, Field(gt=0, le=1)] = Field(1e-4, description="Peak learning rate.")
    batch_tokens: Annotated[int, Field(ge=64, le=16_777_216)] = Field(16384, description="Tokens per step.")
    ttt_steps: Annotated[int, Field(ge=1, le=16)] = Field(
        3, description="Training-time-test unroll depth (speculative steps simulated per position)."
    )
    loss_decay: Annotated[float, Field(gt=0, le=1)] = Field(
        0.8, description="Loss weight decay per TTT step."
    )
    nodes: Annotated[int, Field(ge=1, le=128)] = Field(1, description="Trainer pods (torchrun nodes).")
    gpus_per_node: Annotated[int, Field(ge=1, le=16)] = Field(1, description="GPUs per trainer pod.")
    group_restarts: Annotated[int, Field(ge=0, le=100)] = Field(
        3,
        description="With nodes > 1: how often the whole trainer group starts again, every rank resuming "
        "from the last checkpoint, after one rank failed (a torchrun group cannot take a recreated rank "
        "back, so the Job stops the others at once); then the training fails. 0: fail at the first. A rank "
        "that was evicted or preempted (its pod has the DisruptionTarget condition: a node drain, "
        "preemption) does not spend it, up to disruptionRestarts times.",
    )
    disruption_restarts: Annotated[int, Field(ge=0, le=1000)] = Field(
        20,
        description="With nodes > 1: how often the whole trainer group starts again after a rank was evicted "
        "or preempted (DisruptionTarget), without spending groupRestarts; the cap keeps a crash loop that "
        "looks like disruptions from restarting forever. Beyond it, a disrupted rank spends groupRestarts "
        "like a crash.",
    )
    checkpoint_every: Annotated[int, Field(ge=1)] = Field(
        500, description="Save a checkpoint every N steps (and always at the end)."
    )
    seq_len: Annotated[int, Field(ge=64, le=1_048_576)] = Field(
        2048,
        description="Tokens per packed training row (at most batchTokens, so a step has batchTokens / seqLen "
        "rows).",
    )
    loss_chunk_rows: Annotated[int, Field(ge=1, le=16_777_216)] | None = Field(
        None,
        description="Compute the target head and the loss over this many rows (tokens x TTT steps) at a "
        "time, gradients included, so no step's logits outlive their chunk: at 16K-token rows, 8192 takes "
        "a quarter off the trainer's peak GPU memory at the same speed. Unset: all rows at once.",
    )
    seed: Annotated[int, Field(ge=0)] = Field(0, description="Training seed.")
    resources: dict[str, Any] | None = Field(
        None,
        description="Extra requests and limits of a trainer pod ({requests: {...}, limits: {...}}): CPU and "
        "memory, and the RDMA NIC's extended resource where a device plugin offers one.",
        json_schema_extra=FREE_FORM_OBJECT,
    )
    env: EnvList = env_field(
        "Environment of the trainer containers alone, over target.env and the operator's: RCCL's and "
        "RDMA's settings (NCCL_SOCKET_IFNAME, NCCL_IB_HCA, NCCL_IB_GID_INDEX, NCCL_DEBUG ...)."
    )
    pod_annotations: StringMap = Field(
        default_factory=dict,
        description="Annotations of the trainer pods, e.g. k8s.v1.cni.cncf.io/networks for a Multus "
        "secondary (RDMA) network.",
    )

    @model_validator(mode="after")
    def _steps_or_epochs(self) -> TrainingSpec:
        if self.steps is not None and self.epochs is not None:
            raise ValueError("set training.steps or training.epochs, not both")
        return self

    @property
    def total_steps(self) -> int | None:
        """Steps as given, DEFAULT_STEPS when neither is set; None in epochs (the trainer derives them)."""
        if self.epochs is not None:
            return None
        return self.steps if self.steps is not None else DEFAULT_STEPS

    @property
    def length_args(self) -> list[str]:
        """The trainer's `--steps N` or `--epochs N`."""
        if self.epochs is not None:
            return ["--epochs", str(self.epochs)]
        return ["--steps", str(self.total_steps)]


class SweepSpec(ApiModel):
    """`eagle3 sweep` of the selected checkpoint: tokens/s at K = 0 (off) .. Kmax over a ladder of
    concurrencies, against the target without speculation; the K per concurrency, chosen on speedups
    smoothed over neighbouring concurrencies and never growing with the concurrency, becomes the
    draft's speculation schedule (status.sweep, its eagle3-export.json)."""

    max_speculative_tokens: Annotated[int, Field(ge=1, le=16)] = Field(
        4, description="Kmax: K = 1 .. Kmax are measured (K = 0 is the baseline)."
    )
    concurrency: Annotated[list[Annotated[int, Field(ge=1, le=4096)]], Field(min_length=1, max_length=16)] = (
        Field([1, 2, 4, 8, 16], description="The ladder of concurrencies.")
    )
    rounds: Annotated[int, Field(ge=1, le=16)] = Field(
        1, description="Candidate/baseline pairs (ABBA order) per K and concurrency."
    )


class EvaluationSpec(ApiModel):
    """Measured acceptance of checkpoints with real speculative decoding."""

    every_checkpoints: Annotated[int, Field(ge=1, le=1000)] = Field(
        1, description="Evaluate the first checkpoint, every Nth after it, and always the last."
    )
    prompts: Annotated[list[PromptSource], Field(min_length=1, max_length=16)] | None = Field(
        None,
        description="Evaluation prompt sources, grouped into domains by each row's `domain` field (else the "
        "file name); the first data source when unset.",
    )
    prompts_per_domain: Annotated[int, Field(ge=1, le=100_000)] = Field(
        16, description="Prompts measured per domain (the first ones of each)."
    )
    max_tokens: Annotated[int, Field(ge=1, le=131072)] = Field(
        128, description="Max new tokens per evaluation answer (greedy)."
    )
    concurrency: Annotated[int, Field(ge=1, le=4096)] = Field(
        1, description="Evaluation requests in flight (tokens/s and speedup depend on it)."
    )
    num_speculative_tokens: Annotated[int, Field(ge=1, le=16)] = Field(
        3, description="Speculative tokens per step during evaluation."
    )
    min_acceptance_length: Annotated[float, Field(ge=1, le=17)] | None = Field(
        None, description="Fail the training when the best measured mean acceptance length is below this."
    )
    context_lengths: (
        Annotated[list[Annotated[int, Field(ge=1, le=10_000_000)]], Field(min_length=1, max_length=16)] | None
    ) = Field(
        None,
        description="Also measure acceptance on prompts of exactly these many tokens (ascending, e.g. 1024, 2048, "
        "4096, 8192): the evaluation prompts as one long conversation, cut from the front. Each plus maxTokens "
        "must fit target.maxModelLen. Not measured when unset: long prompts multiply every evaluation's time.",
        json_schema_extra={
            "x-kubernetes-list-type": "set",
            "x-kubernetes-validations": [cel("self.isSorted()", "contextLengths must be in ascending order")],
        },
    )
    context_prompts: Annotated[int, Field(ge=1, le=1024)] = Field(
        4, description="Prompts measured per context length."
    )
    sweep: SweepSpec | None = Field(
        None,
        description="Sweep the selected checkpoint over K and concurrency (a stage between select and "
        "export) for SpecDecodeDeployments with numSpeculativeTokens: auto; no sweep when unset.",
    )


class ExportSpec(ApiModel):
    """Where the selected draft goes."""

    claim_name: DnsName | None = Field(
        None, description="Destination PVC; the workspace PVC when unset (then under export/)."
    )
    path: RelativePath | None = Field(
        None, description="Directory inside the destination PVC; defaults to the DraftTraining's name."
    )
    format: Literal["eagle3", "speculators"] = Field(
        "eagle3", description="eagle3: plain vLLM eagle3 checkpoint; speculators: speculators format."
    )
    quantize: Quantization = Field("none", description="Quantize the exported draft with AMD Quark.")


class StorageSpec(ApiModel):
    """The workspace volume shared by all stages."""

    size: Quantity = Field("100Gi", description="Workspace PVC size.")
    storage_class_name: Annotated[str, Field(max_length=253)] | None = Field(
        None, description="StorageClass of the workspace PVC; the cluster default when unset."
    )
    access_modes: Annotated[
        list[Literal["ReadWriteOnce", "ReadWriteMany", "ReadWriteOncePod"]], Field(min_length=1, max_length=3)
    ] = Field(["ReadWriteOnce"], description="Access modes of the workspace PVC.")
    existing_claim: DnsName | None = Field(
        None, description="Use this existing PVC as the workspace instead of creating one."
    )
    retain_on_delete: bool = Field(
        True,
        description="Keep the workspace PVC (and drafts exported to it) when the DraftTraining is deleted.",
    )


class DraftTrainingSpec(ApiModel):
    """What to train: every stage of the pipeline, from data generation to export."""

    model_config = ApiModel.model_config | {
        "json_schema_extra": {
            "x-kubernetes-validations": [
                cel(
                    "self.training.nodes == 1 || has(self.storage.existingClaim) || "
                    "self.storage.accessModes.exists(m, m == 'ReadWriteMany')",
                    "storage.accessModes must include ReadWriteMany when training.nodes > 1",
                    field_path=".storage.accessModes",
                ),
                cel(
                    "self.training.nodes == 1 || has(self.scheduling.queueName)",
                    "training.nodes > 1 needs scheduling.queueName, a Kueue LocalQueue: Kueue admits every "
                    "trainer pod at once, where pods scheduled one by one would hold their GPUs waiting for the rest",
                    field_path=".scheduling.queueName",
                ),
                cel(
                    "!has(self.evaluation.contextLengths) || has(self.target.maxModelLen)",
                    "evaluation.contextLengths needs target.maxModelLen, the context the target is evaluated with",
                    field_path=".evaluation.contextLengths",
                ),
                cel(
                    "!has(self.evaluation.contextLengths) || !has(self.target.maxModelLen) || "
                    "self.evaluation.contextLengths.max() + self.evaluation.maxTokens <= self.target.maxModelLen",
                    "each evaluation.contextLengths entry plus evaluation.maxTokens must fit target.maxModelLen",
                    field_path=".evaluation.contextLengths",
                ),
                cel(
                    "!has(self.export.path) || has(self.export.claimName)",
                    "export.path needs export.claimName",
                    field_path=".export.path",
                ),
            ]
        }
    }

    target: TargetSpec = Field(
        description="The target model; frozen once a stage has run (a higher spec.restart trains again)."
    )
    runtime: RuntimeSpec = section(RuntimeSpec, "Image and settings of the stage pods.")
    data: DataSpec = Field(description="Data generation.")
    hidden_states: HiddenStatesSpec = section(HiddenStatesSpec, "Hidden-state source for training.")
    draft: DraftSpec = section(DraftSpec, "Draft model shape and initial weights.")
    training: TrainingSpec = section(TrainingSpec, "Training settings.")
    evaluation: EvaluationSpec = section(EvaluationSpec, "Checkpoint evaluation and selection.")
    export: ExportSpec = section(ExportSpec, "Export of the best checkpoint.")
    scheduling: SchedulingSpec = section(SchedulingSpec, "Scheduling of all pods.")
    pod_security: PodSecuritySpec = section(PodSecuritySpec, "Security settings of the pods.")
    image_pull_secrets: ImagePullSecrets = image_pull_secrets_field()
    storage: StorageSpec = section(StorageSpec, "Workspace volume.")
    network_policy: NetworkPolicySpec = section(
        NetworkPolicySpec,
        "A NetworkPolicy that admits to the pods only the DraftTraining's own pods (the hidden-state stream "
        "server hands training samples to whoever connects) and allowedClients.",
    )
    restart: Annotated[int, Field(ge=0, le=1_000_000)] = Field(
        0,
        description="Set to a higher value to train again from the first stage, in a fresh workspace "
        "directory, with the spec as it is then: the one way to change the inputs of a stage that has run "
        "(they are frozen once it starts; earlier runs' files stay on the claim).",
    )


class StageStatus(ApiModel):
    """One pipeline stage."""

    name: TrainingStageName = Field(description="Stage name.")
    state: Literal["Pending", "Running", "Succeeded", "Failed"] = Field(description="Stage state.")
    attempt: int = Field(
        0,
        description="Retry round (it names the stage's Jobs); bumped when a failed training is retried by a "
        "spec edit, and when the trainer group restarts.",
    )
    jobs: list[str] = Field(default_factory=list, description="Jobs of this stage.")
    group_restarts: int = Field(
        0, description="Times the trainer group started again after a rank failed (training.groupRestarts)."
    )
    disruption_restarts: int = Field(
        0,
        description="Times the trainer group started again after a rank was evicted or preempted "
        "(training.disruptionRestarts; Event RankDisrupted).",
    )
    disruption: str | None = Field(
        None,
        description="The first rank of the current trainer group seen evicted or preempted (its pod had the "
        "DisruptionTarget condition): the group's failure then restarts it without spending groupRestarts.",
    )
    start_time: str | None = Field(
        None, description="When the stage started.", json_schema_extra={"format": "date-time"}
    )
    completion_time: str | None = Field(
        None, description="When the stage ended.", json_schema_extra={"format": "date-time"}
    )
    message: str = Field("", description="Outcome or failure reason.")
    metrics: dict[str, Any] = Field(
        default_factory=dict, description="The stage's result metrics.", json_schema_extra=FREE_FORM_OBJECT
    )


class CheckpointEvaluation(ApiModel):
    """Measured speculative decoding of one checkpoint."""

    step: int = Field(description="Checkpoint step.")
    acceptance_length: float | None = Field(None, description="Mean acceptance length (1 + accepted/drafts).")
    acceptance_per_position: list[float] = Field(
        default_factory=list, description="Acceptance rate per speculative position."
    )
    tokens_per_second: float | None = Field(None, description="Generation throughput with the draft.")
    speedup: float | None = Field(None, description="Throughput relative to the target alone.")


class ContextLengthAcceptance(ApiModel):
    """Measured acceptance on prompts of one length (evaluation.contextLengths)."""

    context_length: int = Field(description="Prompt length in tokens.")
    acceptance_length: float | None = Field(
        None,
        description="Mean acceptance length on those prompts; absent when the evaluation prompts could not fill "
        "prompts this long (the evaluation's file says how long they reached).",
    )
    drafts: float | None = Field(None, description="Speculative drafts it was measured over.")


class BestCheckpoint(ApiModel):
    """The selected checkpoint."""

    step: int = Field(description="Checkpoint step.")
    acceptance_length: float | None = Field(None, description="Its measured mean acceptance length.")
    acceptance_by_context_length: Annotated[list[ContextLengthAcceptance], Field(max_length=16)] = Field(
        default_factory=list, description="Its acceptance per evaluation.contextLengths entry."
    )


class ExportedDraft(ApiModel):
    """The exported draft, loadable by vLLM (method eagle3)."""

    claim_name: str = Field(description="PVC holding the draft.")
    path: str = Field(
        description="Directory inside the PVC: DESTINATION/sha256-<digest prefix>, never overwritten by a later export."
    )
    uri: str = Field(description="pvc://CLAIM/PATH, usable as a SpecDecodeDeployment draft.model.")
    digest: str | None = Field(
        None, description="sha256 content digest of the draft's files (also in its eagle3-export.json)."
    )
    format: str = Field(description="Checkpoint format.")
    quantization: str = Field(description="Draft quantization.")


class SweepPoint(ApiModel):
    """The best K at one concurrency of the sweep."""

    concurrency: int = Field(description="Requests in flight.")
    num_speculative_tokens: int = Field(description="The fastest K (0: no speculation was fastest).")
    speedup: float = Field(description="Its tokens/s over the no-speculation rounds beside it.")


class SweepResult(ApiModel):
    """The sweep of the exported draft (evaluations/sweep-DRAFT.json has every round)."""

    schedule: list[list[int]] = Field(
        description="vLLM num_speculative_tokens_per_batch_size: [first batch size, last batch size, K]."
    )
    num_speculative_tokens: int = Field(description="The schedule's largest K (what vLLM caps it at).")
    best: list[SweepPoint] = Field(
        default_factory=list,
        description="The fastest K measured at each concurrency (the schedule smooths these over neighbouring "
        "concurrencies).",
    )


class DraftTrainingStatus(ApiModel):
    """Observed state of the pipeline."""

    phase: Phase | None = Field(None, description="Pending, Running, Succeeded or Failed.")
    stage: str | None = Field(None, description="The stage running now (or the one that failed).")
    observed_generation: int | None = Field(None, description="Latest metadata.generation acted upon.")
    conditions: list[Condition] = Field(
        default_factory=list,
        description="One condition per stage, plus TargetReady, Failed and Ready.",
        json_schema_extra=CONDITIONS_FIELD,
    )
    stages: Annotated[list[StageStatus], Field(max_length=16)] = Field(
        default_factory=list,
        description="Per-stage state and results.",
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["name"]},
    )
    progress: Progress | None = Field(None, description="Latest progress of the running stage.")
    checkpoints: list[CheckpointEvaluation] = Field(
        default_factory=list, description="Evaluated checkpoints."
    )
    best_checkpoint: BestCheckpoint | None = Field(None, description="The checkpoint selected for export.")
    export: ExportedDraft | None = Field(None, description="The exported draft.")
    sweep: SweepResult | None = Field(
        None, description="The speculation schedule measured by the sweep stage (evaluation.sweep)."
    )
    workspace_claim: str | None = Field(None, description="The workspace PVC.")
    workspace_path: str | None = Field(
        None,
        description="This run's own directory inside the workspace PVC (runs/UID, runs/UID-restart-N after a "
        "spec.restart); empty: the PVC's root, for objects started before there was one.",
    )
    restart: int | None = Field(None, description="The spec.restart this run started from.")
    start_time: str | None = Field(
        None, description="When the pipeline started.", json_schema_extra={"format": "date-time"}
    )
    completion_time: str | None = Field(
        None, description="When the pipeline ended.", json_schema_extra={"format": "date-time"}
    )


# Spec fields that are stage inputs -> the stages that read them (None: every stage). A field is frozen
# once one of its readers is Running or Succeeded: their Jobs, files and results came from it, so an edit
# would leave a status (and status.export) that describes another spec. A failed reader leaves it
# editable (the edit retries the stage); spec.restart lifts the freeze by starting a new run. Adding a
# stage that has not run (export.quantize after an export) stays possible.
STAGE_INPUTS: dict[str, list[str] | None] = {
    "target": None,
    "storage": None,
    "data": ["generate"],
    "hiddenStates": ["extract", "train"],
    "draft": ["train"],
    "training": ["train"],
    "evaluation": ["evaluate", "select"],
    "export.format": ["export"],
    "export.claimName": ["export", "quantize"],
    "export.path": ["export", "quantize"],
    "export.quantize": ["quantize"],
}
# Fields of STAGE_INPUTS without a default (absent unless set).
OPTIONAL_INPUTS = {"export.claimName", "export.path"}


def _frozen_once_run(field: str, readers: list[str] | None) -> dict[str, str]:
    started = "(s.state == 'Running' || s.state == 'Succeeded')"
    if readers:
        names = ", ".join(f"'{r}'" for r in readers)
        started = f"s.name in [{names}] && {started}"
        who = "stage " + " or ".join(readers) + " has run or is running"
    else:
        who = "a stage has run or is running"
    new, old = f"self.spec.{field}", f"oldSelf.spec.{field}"
    if field in OPTIONAL_INPUTS:
        new, old = (f"(has({x}) ? {x} : '')" for x in (new, old))
    return cel(
        f"{new} == {old} || self.spec.restart != oldSelf.spec.restart || "
        "!has(oldSelf.status) || !has(oldSelf.status.stages) || "
        f"!oldSelf.status.stages.exists(s, {started})",
        f"spec.{field} cannot change once {who}: the results in status come from it. Set spec.restart "
        "to a higher value in the same edit to train again from the start, or create a new DraftTraining",
        field_path=f".spec.{field}",
        reason="FieldValueForbidden",
    )


class DraftTraining(ApiModel):
    """Trains an EAGLE-3 draft for a target model with the target's own outputs, measures it, exports it."""

    model_config = ApiModel.model_config | {
        "json_schema_extra": {
            "x-kubernetes-validations": [
                cel(
                    "size(self.metadata.name) <= 40",
                    "metadata.name must be at most 40 characters (child Job names derive from it)",
                    reason="FieldValueInvalid",
                ),
                *(_frozen_once_run(field, readers) for field, readers in STAGE_INPUTS.items()),
                cel(
                    "self.spec.restart >= oldSelf.spec.restart",
                    "spec.restart may only grow: each value is one run of the pipeline",
                    field_path=".spec.restart",
                    reason="FieldValueForbidden",
                ),
            ]
        }
    }

    api_version: str = Field(description="eagle3.ai/v1alpha1")
    kind: str = Field(description="DraftTraining")
    metadata: dict[str, Any] = Field(default_factory=dict, description="Standard object metadata.")
    spec: DraftTrainingSpec = Field(description="Desired pipeline.")
    status: DraftTrainingStatus = Field(default_factory=DraftTrainingStatus, description="Observed pipeline.")
