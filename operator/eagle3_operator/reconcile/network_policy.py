"""The optional NetworkPolicy around an owner's pods (spec.networkPolicy).

Unprotected, a vLLM server answers anyone in the cluster, and a DraftTraining's streaming extraction
server hands its hidden states (training samples) over zmq to whoever connects. With the policy, the
owner's pods admit only each other (stage pods to their servers, trainer ranks to rank 0) and, on the
vLLM HTTP port alone, the peers the user lists in `networkPolicy.allowedClients` (clients, gateway,
Prometheus). Egress is left alone: stages download models and datasets.

A NetworkPolicy only takes effect where the network plugin enforces it (Calico, Cilium, ...).
"""

from __future__ import annotations

from typing import Any

from eagle3_api.common import NetworkPolicySpec
from eagle3_operator.reconcile import meta
from eagle3_operator.reconcile.plan import Plan
from eagle3_operator.reconcile.pods import VLLM_PORT

API_VERSION = "networking.k8s.io/v1"
KIND = "NetworkPolicy"
COMPONENT = "network-policy"


def policy_name(owner: dict[str, Any]) -> str:
    return meta.dns_label(f"{owner['metadata']['name']}-pods")


def network_policy(owner: dict[str, Any], owner_label: str, spec: NetworkPolicySpec) -> dict[str, Any]:
    """The policy: pods labelled `owner_label=<owner name>` admit each other on every port, and
    `spec.allowed_clients` on the vLLM HTTP port."""
    name = owner["metadata"]["name"]
    own_pods = {"podSelector": {"matchLabels": {owner_label: name}}}
    ingress: list[dict[str, Any]] = [{"from": [own_pods]}]
    if spec.allowed_clients:
        ingress.append(
            {"from": list(spec.allowed_clients), "ports": [{"protocol": "TCP", "port": VLLM_PORT}]}
        )
    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "metadata": meta.object_meta(owner, policy_name(owner), meta.labels(name, COMPONENT, owner_label)),
        "spec": {"podSelector": own_pods["podSelector"], "policyTypes": ["Ingress"], "ingress": ingress},
    }


def plan_network_policy(
    plan: Plan, owner: dict[str, Any], owner_label: str, existing: list[dict[str, Any]]
) -> None:
    """Keep the policy in sync while spec.networkPolicy.enabled; remove ours once it is turned off.
    `existing`: the owner's NetworkPolicies as observed."""
    spec = NetworkPolicySpec.model_validate((owner.get("spec") or {}).get("networkPolicy") or {})
    if spec.enabled:
        plan.sync.append(network_policy(owner, owner_label, spec))
        return
    for policy in existing:
        if policy["metadata"]["name"] == policy_name(owner):
            plan.delete.append({"apiVersion": API_VERSION, "kind": KIND, "name": policy["metadata"]["name"]})
