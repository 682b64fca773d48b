"""The API server itself refuses invalid objects, with messages that name the field (CRD schema + CEL)."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from tests.operator import fakes
from tests.operator.harness import draft_training_path, spec_decode_path
from tests.support.cluster import ApiError, LocalCluster


def _invalid(body: dict[str, Any], changes: dict[str, Any]) -> dict[str, Any]:
    """`body` named "invalid", with each dotted path in `changes` set (or dropped, with _DROP)."""
    body["metadata"] = {"name": "invalid"}
    for path, value in changes.items():
        node = body
        *parents, leaf = path.split(".")
        for part in parents:
            node = node.setdefault(part, {})
        if value is _DROP:
            node.pop(leaf)
        else:
            node[leaf] = value
    return body


def _dt(**changes: Any) -> dict[str, Any]:
    return _invalid(fakes.draft_training(), changes)


def _sdd(**changes: Any) -> dict[str, Any]:
    return _invalid(fakes.spec_decode(), changes)


_DROP = object()
CONTEXT = {"spec.target.maxModelLen": 8448}  # room for 8192-token prompts and their answers
INVALID = [
    # (case id, object, text the refusal must contain: the field, and for CEL rules the message)
    ("dt-no-data", _dt(**{"spec.data": _DROP}), "spec.data: Required value"),
    ("dt-no-sources", _dt(**{"spec.data.sources": []}), "spec.data.sources"),
    ("dt-bad-model", _dt(**{"spec.target.model": "not a model!"}), "spec.target.model"),
    ("dt-bad-quantization", _dt(**{"spec.target.quantization": "int4"}), "spec.target.quantization"),
    (
        "dt-gpus-below-tp",
        _dt(**{"spec.target.tensorParallelSize": 4, "spec.target.gpus": 2}),
        "gpus must be at least tensorParallelSize",
    ),
    (
        "dt-revision-of-a-directory",
        _dt(**{"spec.target.model": "pvc://models/llama", "spec.target.revision": "v2"}),
        "revision names a version of a Hugging Face id",
    ),
    ("dt-bad-hidden-mode", _dt(**{"spec.hiddenStates": {"mode": "magic"}}), "spec.hiddenStates.mode"),
    ("dt-two-layer-ids", _dt(**{"spec.hiddenStates": {"layerIds": [1, 2]}}), "spec.hiddenStates.layerIds"),
    (
        "dt-duplicate-layer-ids",
        _dt(**{"spec.hiddenStates": {"layerIds": [3, 3, 5]}}),
        "spec.hiddenStates.layerIds",
    ),
    (
        "dt-checkpoint-after-end",
        _dt(**{"spec.training": {"steps": 10, "checkpointEvery": 50}}),
        "checkpointEvery must not exceed steps",
    ),
    (
        "dt-steps-and-epochs",
        _dt(**{"spec.training": {"steps": 100, "epochs": 2}}),
        "set steps or epochs, not both",
    ),
    ("dt-zero-epochs", _dt(**{"spec.training": {"epochs": 0}}), "spec.training.epochs"),
    (
        "dt-checkpoint-after-default-steps",
        _dt(**{"spec.training": {"checkpointEvery": 5000}}),
        "checkpointEvery must not exceed steps",
    ),
    ("dt-draft-layers", _dt(**{"spec.draft": {"layers": 5}}), "spec.draft.layers"),
    (
        "dt-init-checkpoint-without-path",
        _dt(**{"spec.draft": {"initialization": {"from": "checkpoint"}}}),
        "path is required when from is checkpoint",
    ),
    (
        "dt-init-path-from-scratch",
        _dt(**{"spec.draft": {"initialization": {"path": "org/eagle3-head"}}}),
        "path is required when from is checkpoint",
    ),
    (
        "dt-init-bad-path",
        _dt(**{"spec.draft": {"initialization": {"from": "checkpoint", "path": "a b"}}}),
        "spec.draft.initialization.path",
    ),
    ("dt-loss-decay", _dt(**{"spec.training": {"lossDecay": 1.5}}), "spec.training.lossDecay"),
    ("dt-learning-rate", _dt(**{"spec.training": {"learningRate": 0}}), "spec.training.learningRate"),
    ("dt-multinode-rwo", _dt(**{"spec.training": {"nodes": 2}}), "spec.storage.accessModes"),
    (
        "dt-multinode-without-queue",
        _dt(**{"spec.training": {"nodes": 2}, "spec.storage": {"accessModes": ["ReadWriteMany"]}}),
        "training.nodes > 1 needs scheduling.queueName, a Kueue LocalQueue",
    ),
    ("dt-export-format", _dt(**{"spec.export": {"format": "onnx"}}), "spec.export.format"),
    (
        "dt-export-path-no-claim",
        _dt(**{"spec.export": {"path": "drafts/x"}}),
        "export.path needs export.claimName",
    ),
    ("dt-storage-size", _dt(**{"spec.storage": {"size": "lots"}}), "spec.storage.size"),
    ("dt-long-name", _dt(**{"metadata.name": "a" * 41}), "metadata.name must be at most 40 characters"),
    (
        "dt-bad-tolerance",
        _dt(**{"spec.scheduling": {"tolerations": [{"operator": "Maybe"}]}}),
        "spec.scheduling.tolerations[0].operator",
    ),
    (
        "sdd-both-drafts",
        _sdd(**{"spec.draft": {"model": "org/d", "fromDraftTraining": "x"}}),
        "set exactly one of draft.model or draft.fromDraftTraining",
    ),
    ("sdd-no-draft", _sdd(**{"spec.draft": {}}), "set exactly one of draft.model or draft.fromDraftTraining"),
    ("sdd-zero-tokens", _sdd(**{"spec.numSpeculativeTokens": 0}), "spec.numSpeculativeTokens"),
    ("sdd-negative-replicas", _sdd(**{"spec.replicas": -1}), "spec.replicas"),
    ("sdd-service-type", _sdd(**{"spec.service": {"type": "Ingress"}}), "spec.service.type"),
    ("sdd-interval", _sdd(**{"spec.monitoring": {"interval": "soon"}}), "spec.monitoring.interval"),
    (
        "sdd-env-both",
        _sdd(
            **{"spec.target.env": [{"name": "A", "value": "1", "valueFrom": {"secretKeyRef": {"name": "s"}}}]}
        ),
        "env entries take value or valueFrom, not both",
    ),
    (
        "sdd-gpu-resource",
        _sdd(**{"spec.target.gpuResourceName": "nvidia.com/gpu"}),
        "spec.target.gpuResourceName",
    ),
    (
        "sdd-tokens-word",
        _sdd(**{"spec.numSpeculativeTokens": "many"}),
        'numSpeculativeTokens must be an integer from 1 to 16, or "auto"',
    ),
    (
        "sdd-too-many-tokens",
        _sdd(**{"spec.numSpeculativeTokens": 17}),
        'numSpeculativeTokens must be an integer from 1 to 16, or "auto"',
    ),
    (
        "sdd-reserved-speculative-key",
        _sdd(**{"spec.speculativeConfig": {"num_speculative_tokens": "9"}}),
        "speculativeConfig must not set method, model, revision, num_speculative_tokens",
    ),
    (
        "sdd-schedule-not-from-one",
        _sdd(**{"spec.draft.speculationSchedule": [[2, 4, 1]]}),
        "the first speculationSchedule range must start at batch size 1",
    ),
    (
        "sdd-schedule-short-range",
        _sdd(**{"spec.draft.speculationSchedule": [[1, 4]]}),
        "spec.draft.speculationSchedule[0]",
    ),
    (
        "dt-sweep-kmax",
        _dt(**{"spec.evaluation": {"sweep": {"maxSpeculativeTokens": 0}}}),
        "spec.evaluation.sweep.maxSpeculativeTokens",
    ),
    # evaluation.contextLengths: positive, ascending, no repeats, each plus maxTokens within target.maxModelLen.
    (
        "dt-context-descending",
        _dt(**CONTEXT, **{"spec.evaluation": {"contextLengths": [2048, 1024]}}),
        "contextLengths must be in ascending order",
    ),
    (
        "dt-context-repeated",
        _dt(**CONTEXT, **{"spec.evaluation": {"contextLengths": [1024, 1024]}}),
        "spec.evaluation.contextLengths[1]: Duplicate value",
    ),
    (
        "dt-context-zero",
        _dt(**CONTEXT, **{"spec.evaluation": {"contextLengths": [0, 1024]}}),
        "spec.evaluation.contextLengths[0]",
    ),
    (
        "dt-context-no-max-model-len",
        _dt(**{"spec.evaluation": {"contextLengths": [1024]}}),
        "evaluation.contextLengths needs target.maxModelLen",
    ),
    # 8192 + the default maxTokens 128 > 8256; with maxModelLen 8448 the answer must stay within 256.
    (
        "dt-context-over-the-context",
        _dt(**{"spec.target.maxModelLen": 8256, "spec.evaluation": {"contextLengths": [8192]}}),
        "each evaluation.contextLengths entry plus evaluation.maxTokens must fit target.maxModelLen",
    ),
    (
        "dt-context-answer-over-the-context",
        _dt(**CONTEXT, **{"spec.evaluation": {"contextLengths": [1024, 8192], "maxTokens": 512}}),
        "each evaluation.contextLengths entry plus evaluation.maxTokens must fit target.maxModelLen",
    ),
]


@pytest.mark.parametrize("body,expected", [pytest.param(b, e, id=i) for i, b, e in INVALID])
def test_api_server_refuses_invalid_objects(crds: LocalCluster, namespace: str, body: dict, expected: str):
    path = (draft_training_path if body["kind"] == "DraftTraining" else spec_decode_path)(namespace)
    with pytest.raises(ApiError) as refused:
        crds.request("POST", path, body)
    assert refused.value.status == 422, refused.value
    assert expected in str(refused.value), f"refusal does not say {expected!r}: {refused.value}"


def test_valid_objects_are_accepted_with_defaults(crds: LocalCluster, namespace: str):
    created = crds.request("POST", draft_training_path(namespace), _dt(**{"metadata.name": "ok"}))
    spec = created["spec"]
    assert spec["training"]["tttSteps"] == 3 and spec["storage"]["retainOnDelete"] is True
    assert spec["hiddenStates"]["mode"] == "offline" and spec["target"]["image"].startswith(
        "vllm/vllm-openai-rocm"
    )
    sdd = crds.request("POST", spec_decode_path(namespace), _sdd(**{"metadata.name": "ok"}))
    assert sdd["spec"]["replicas"] == 1 and sdd["spec"]["monitoring"]["serviceMonitor"] is True


def test_ascending_context_lengths_within_the_context_are_accepted(crds: LocalCluster, namespace: str):
    body = _dt(
        **CONTEXT,
        **{"metadata.name": "long", "spec.evaluation": {"contextLengths": [1024, 2048, 4096, 8192]}},
    )
    evaluation = crds.request("POST", draft_training_path(namespace), body)["spec"]["evaluation"]
    assert evaluation["contextLengths"] == [1024, 2048, 4096, 8192] and evaluation["contextPrompts"] == 4


def test_auto_speculation_and_extra_speculative_config_keys_are_kept(crds: LocalCluster, namespace: str):
    body = _sdd(
        **{
            "metadata.name": "auto",
            "spec.numSpeculativeTokens": "auto",
            "spec.expectedConcurrency": 4,
            "spec.speculativeConfig": {
                "draft_tensor_parallel_size": "1",
                "disable_padded_drafter_batch": "true",
            },
            "spec.draft.speculationSchedule": [[1, 2, 4], [3, 16, 0]],
        }
    )
    spec = crds.request("POST", spec_decode_path(namespace), body)["spec"]
    assert spec["numSpeculativeTokens"] == "auto" and spec["expectedConcurrency"] == 4
    assert spec["speculativeConfig"] == {
        "draft_tensor_parallel_size": "1",
        "disable_padded_drafter_batch": "true",
    }
    assert spec["draft"]["speculationSchedule"] == [[1, 2, 4], [3, 16, 0]]
    dt = crds.request(
        "POST",
        draft_training_path(namespace),
        _dt(**{"metadata.name": "swept", "spec.evaluation": {"sweep": {}}}),
    )
    assert dt["spec"]["evaluation"]["sweep"] == {
        "maxSpeculativeTokens": 4,
        "concurrency": [1, 2, 4, 8, 16],
        "rounds": 1,
    }


def test_epochs_and_a_warm_started_multi_layer_draft_are_accepted(crds: LocalCluster, namespace: str):
    body = _dt(
        **{
            "metadata.name": "epochs",
            "spec.training": {"epochs": 3},
            "spec.draft": {
                "layers": 2,
                "initialization": {"from": "checkpoint", "path": "pvc://drafts/head"},
            },
        }
    )
    spec = crds.request("POST", draft_training_path(namespace), body)["spec"]
    assert spec["training"]["epochs"] == 3 and "steps" not in spec["training"]
    assert spec["draft"] == {
        "vocabSize": 32000,
        "layers": 2,
        "initialization": {"from": "checkpoint", "path": "pvc://drafts/head"},
    }
    # Neither given: no steps is stored (the operator runs 2000), the draft starts from scratch.
    bare = crds.request(
        "POST", draft_training_path(namespace), _dt(**{"metadata.name": "bare", "spec.training": {}})
    )
    assert "steps" not in bare["spec"]["training"] and "epochs" not in bare["spec"]["training"]
    assert bare["spec"]["draft"] == {"vocabSize": 32000, "layers": 1, "initialization": {"from": "scratch"}}


def test_stage_inputs_freeze_once_their_stage_runs_and_restart_lifts_it(crds: LocalCluster, namespace: str):
    crds.request("POST", draft_training_path(namespace), _dt(**{"metadata.name": "frozen"}))
    path = draft_training_path(namespace, "frozen")
    running = {"name": "generate", "state": "Running", "attempt": 0}
    crds.request("PATCH", f"{path}/status", {"status": {"phase": "Running", "stages": [running]}})
    change = {"spec": {"target": {"model": "org/other-model"}}}
    with pytest.raises(ApiError) as refused:
        crds.request("PATCH", path, change)
    assert refused.value.status == 422
    assert "spec.target: Forbidden: spec.target cannot change once a stage has run or is running" in str(
        refused.value
    ), refused.value
    with pytest.raises(ApiError) as refused:
        crds.request("PATCH", path, {"spec": {"data": {"numSamples": 7}}})
    assert "spec.data cannot change once stage generate has run or is running" in str(refused.value)
    with pytest.raises(ApiError) as refused:
        crds.request("PATCH", path, {"spec": {"restart": 0, "storage": {"size": "1Gi"}}})
    assert "spec.storage cannot change" in str(refused.value)
    # Inputs of stages that have not started, and settings that are no stage's input, stay editable.
    crds.request("PATCH", path, {"spec": {"evaluation": {"numSpeculativeTokens": 4}}})
    crds.request("PATCH", path, {"spec": {"runtime": {"backoffLimit": 3}}})
    # A failed stage's inputs are editable: the edit retries it.
    failed = running | {"state": "Failed"}
    crds.request("PATCH", f"{path}/status", {"status": {"phase": "Failed", "stages": [failed]}})
    assert crds.request("PATCH", path, copy.deepcopy(change))["spec"]["target"]["model"] == "org/other-model"
    # Once a stage has succeeded, only a new run (a higher spec.restart in the same edit) changes its inputs.
    done = running | {"state": "Succeeded"}
    crds.request("PATCH", f"{path}/status", {"status": {"phase": "Succeeded", "stages": [done]}})
    back = {"spec": {"target": {"model": "org/first-model"}}}
    with pytest.raises(ApiError):
        crds.request("PATCH", path, copy.deepcopy(back))
    assert crds.request("PATCH", path, back | {"spec": back["spec"] | {"restart": 1}})["spec"]["restart"] == 1
    with pytest.raises(ApiError) as refused:
        crds.request("PATCH", path, {"spec": {"restart": 0}})
    assert "spec.restart may only grow" in str(refused.value)


def test_kubectl_explain_describes_fields(crds: LocalCluster):
    text = " ".join(crds.kubectl("explain", "drafttraining.spec.hiddenStates.mode").split())
    assert "offline: an extraction Job writes them to the workspace" in text
    text = " ".join(crds.kubectl("explain", "dt.spec.draft.initialization.from").split())
    assert "checkpoint: warm start from an existing EAGLE-3 draft" in text
    text = " ".join(crds.kubectl("explain", "sdd.spec.draft.fromDraftTraining").split())
    assert "its exported draft is used once it succeeds" in text
