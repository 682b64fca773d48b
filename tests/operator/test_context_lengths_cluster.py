"""evaluation.contextLengths as the API server validates it (CRD schema + CEL): positive, ascending,
no repeats, and every length plus evaluation.maxTokens within target.maxModelLen."""

from __future__ import annotations

from typing import Any

import pytest

from tests.operator import fakes
from tests.operator.harness import draft_training_path
from tests.support.cluster import ApiError, LocalCluster


def _dt(
    name: str, context_lengths: Any, max_model_len: int | None = 8448, **evaluation: Any
) -> dict[str, Any]:
    body = fakes.draft_training(evaluation={"contextLengths": context_lengths, **evaluation})
    body["metadata"] = {"name": name}
    if max_model_len is not None:
        body["spec"]["target"]["maxModelLen"] = max_model_len
    return body


REFUSED = [
    ("descending", _dt("x", [2048, 1024]), "contextLengths must be in ascending order"),
    ("repeated", _dt("x", [1024, 1024]), "spec.evaluation.contextLengths[1]: Duplicate value"),
    ("zero", _dt("x", [0, 1024]), "spec.evaluation.contextLengths[0]"),
    ("no-max-model-len", _dt("x", [1024], max_model_len=None), "evaluation.contextLengths needs target.maxModelLen"),
    # 8192 + the default maxTokens 128 > 8256; the same list fits 8448 (accepted below).
    ("over-the-context", _dt("x", [1024, 8192], max_model_len=8256),
     "each evaluation.contextLengths entry plus evaluation.maxTokens must fit target.maxModelLen"),
    ("answer-over-the-context", _dt("x", [1024, 8192], maxTokens=512),
     "each evaluation.contextLengths entry plus evaluation.maxTokens must fit target.maxModelLen"),
]  # fmt: skip


@pytest.mark.parametrize("body,expected", [pytest.param(b, e, id=i) for i, b, e in REFUSED])
def test_api_server_refuses_bad_context_lengths(
    crds: LocalCluster, namespace: str, body: dict, expected: str
):
    with pytest.raises(ApiError) as refused:
        crds.request("POST", draft_training_path(namespace), body)
    assert refused.value.status == 422, refused.value
    assert expected in str(refused.value), f"refusal does not say {expected!r}: {refused.value}"


def test_ascending_context_lengths_within_the_context_are_accepted(crds: LocalCluster, namespace: str):
    created = crds.request("POST", draft_training_path(namespace), _dt("ok", [1024, 2048, 4096, 8192]))
    evaluation = created["spec"]["evaluation"]
    assert evaluation["contextLengths"] == [1024, 2048, 4096, 8192] and evaluation["contextPrompts"] == 4
