"""The API models and the CRDs generated from them (no cluster)."""

from __future__ import annotations

import pytest
import yaml
from pydantic import Field

from eagle3_api import crdgen
from eagle3_api.base import ApiModel
from eagle3_api.draft_training import DraftTraining
from eagle3_api.schema import SchemaError, structural_schema
from eagle3_api.spec_decode_deployment import SpecDecodeDeployment


def test_generated_crd_files_match_the_models():
    assert crdgen.main(["--check"]) == 0, "crds/ drifted from the API models: run `make crds`"


def _walk(schema: dict, path: str = ""):
    yield path, schema
    for name, sub in schema.get("properties", {}).items():
        yield from _walk(sub, f"{path}.{name}")
    if "items" in schema:
        yield from _walk(schema["items"], f"{path}[]")
    if isinstance(schema.get("additionalProperties"), dict):
        yield from _walk(schema["additionalProperties"], f"{path}{{}}")


@pytest.mark.parametrize("name", sorted(crdgen.build_crds()))
def test_crd_schemas_are_structural_and_explained(name):
    crd = crdgen.build_crds()[name]
    schema = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    for path, node in _walk(schema):
        assert "$ref" not in node and "anyOf" not in node and "allOf" not in node, path
        untyped = node.get("x-kubernetes-preserve-unknown-fields") or node.get("x-kubernetes-int-or-string")
        assert "type" in node or untyped, f"{path} has no type"
        assert "title" not in node, path
    for root in ("spec", "status"):
        for path, node in _walk(schema["properties"][root], root):
            is_field = not path.endswith("[]") and not path.endswith("{}")
            assert not is_field or node.get("description"), f"{path} has no description"
    # Defaults are only for spec fields: status defaults would be re-applied on every read.
    assert not [p for p, n in _walk(schema["properties"]["status"]) if "default" in n]


def test_round_trip_through_yaml_keeps_everything():
    for crd in crdgen.build_crds().values():
        assert yaml.safe_load(crdgen.render(crd)) == crd


def test_sections_default_to_empty_objects_so_inner_defaults_apply():
    spec = crdgen.build_crds()["eagle3.ai_drafttrainings.yaml"]["spec"]["versions"][0]["schema"][
        "openAPIV3Schema"
    ]["properties"]["spec"]
    assert spec["properties"]["training"]["default"] == {}
    assert spec["properties"]["training"]["properties"]["learningRate"]["default"] == 1e-4
    assert spec["properties"]["draft"]["properties"]["initialization"]["default"] == {}
    # A defaulted steps would collide with a given epochs: 2000 steps is the operator's reading of neither.
    assert "default" not in spec["properties"]["training"]["properties"]["steps"]
    assert spec["required"] == ["target", "data"]


def test_scale_subresource_and_short_names():
    sdd = crdgen.build_crds()["eagle3.ai_specdecodedeployments.yaml"]["spec"]
    assert sdd["names"]["shortNames"] == ["sdd"]
    assert sdd["versions"][0]["subresources"]["scale"] == {
        "specReplicasPath": ".spec.replicas",
        "statusReplicasPath": ".status.replicas",
        "labelSelectorPath": ".status.selector",
    }
    dt = crdgen.build_crds()["eagle3.ai_drafttrainings.yaml"]["spec"]
    assert dt["names"]["shortNames"] == ["dt"] and "eagle3" in dt["names"]["categories"]


def test_models_parse_camel_case_and_fill_defaults():
    body = {
        "apiVersion": "eagle3.ai/v1alpha1",
        "kind": "DraftTraining",
        "metadata": {"name": "x"},
        "spec": {
            "target": {"model": "meta-llama/Llama-3.1-8B-Instruct", "tensorParallelSize": 1},
            "data": {"sources": [{"claimName": "prompts", "path": "chat.jsonl"}]},
            "hiddenStates": {"mode": "online", "layerIds": [2, 16, 29]},
        },
    }
    obj = DraftTraining.model_validate(body)
    assert obj.spec.hidden_states.layer_ids == [2, 16, 29]
    assert obj.spec.training.ttt_steps == 3
    assert obj.spec.storage.retain_on_delete is True
    sdd = SpecDecodeDeployment.model_validate(
        {
            "apiVersion": "eagle3.ai/v1alpha1",
            "kind": "SpecDecodeDeployment",
            "spec": {"target": {"model": "pvc://models/llama"}, "draft": {"fromDraftTraining": "x"}},
        }
    )
    assert sdd.spec.draft.from_draft_training == "x" and sdd.spec.replicas == 1


def test_schema_generator_refuses_unexplained_or_untyped_fields():
    class Undocumented(ApiModel):
        count: int = 1

    class Untyped(ApiModel):
        anything: object = Field(None, description="no type")

    with pytest.raises(SchemaError, match="description"):
        structural_schema(Undocumented)
    with pytest.raises(SchemaError, match="no type"):
        structural_schema(Untyped)


def _spec(**sections) -> dict:
    return {
        "target": {"model": "org/target"},
        "data": {"sources": [{"claimName": "prompts", "path": "chat.jsonl"}]},
        **sections,
    }


def test_training_length_is_steps_or_epochs():
    from pydantic import ValidationError

    from eagle3_api.draft_training import DraftTrainingSpec

    assert DraftTrainingSpec.model_validate(_spec()).training.length_args == ["--steps", "2000"]
    assert DraftTrainingSpec.model_validate(_spec(training={"steps": 7})).training.length_args == [
        "--steps",
        "7",
    ]
    assert DraftTrainingSpec.model_validate(_spec(training={"epochs": 3})).training.length_args == [
        "--epochs",
        "3",
    ]
    with pytest.raises(ValidationError, match="steps or training.epochs, not both"):
        DraftTrainingSpec.model_validate(_spec(training={"steps": 7, "epochs": 3}))


def test_draft_initialization_needs_a_path_exactly_when_from_a_checkpoint():
    from pydantic import ValidationError

    from eagle3_api.draft_training import DraftTrainingSpec

    draft = DraftTrainingSpec.model_validate(_spec()).draft
    assert (draft.layers, draft.initialization.source, draft.initialization.path) == (1, "scratch", None)
    warm = {"layers": 2, "initialization": {"from": "checkpoint", "path": "pvc://drafts/head"}}
    assert DraftTrainingSpec.model_validate(_spec(draft=warm)).draft.initialization.to_json() == {
        "from": "checkpoint",
        "path": "pvc://drafts/head",
    }
    for bad in ({"from": "checkpoint"}, {"from": "scratch", "path": "org/head"}):
        with pytest.raises(ValidationError, match="path is required when from is checkpoint"):
            DraftTrainingSpec.model_validate(_spec(draft={"initialization": bad}))


def test_draft_layer_bound_is_the_runtime_bound():
    from eagle3_api.draft_training import MAX_DRAFT_LAYERS
    from eagle3_runtime.model import config

    assert MAX_DRAFT_LAYERS == config.MAX_DRAFT_LAYERS
