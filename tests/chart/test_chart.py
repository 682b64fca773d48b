"""helm lint / helm template of helm/eagle3-operator with the real helm binary, for several values sets."""

from __future__ import annotations

import json

import pytest

from tests.chart.helm import CHART_DIR, RELEASE, HelmError, by_kind, helm, render, values_args

MONITORING_ON = {
    "metrics": {
        "serviceMonitor": {"enabled": True, "additionalLabels": {"release": "kube-prometheus-stack"}},
        "podMonitor": {"enabled": True, "additionalLabels": {"release": "kube-prometheus-stack"}},
    },
    "prometheusRule": {"enabled": True, "additionalLabels": {"release": "kube-prometheus-stack"}},
    "grafana": {"dashboards": {"annotations": {"grafana_folder": "EAGLE-3"}}},
}
NAMESPACED = {"watchNamespaces": ["team-a", "team-b"]}
VALUES_SETS = {
    "defaults": [],
    "namespaced": [NAMESPACED],
    "monitoring": [MONITORING_ON],
    "namespaced-monitoring": [NAMESPACED, MONITORING_ON],
    "no-rbac-existing-sa": [{"rbac": {"create": False}, "serviceAccount": {"create": False, "name": "ops"}}],
}
# Never granted by the chart: secrets, escalation, impersonation, wildcards.
FORBIDDEN_VERBS = {"bind", "escalate", "impersonate", "*"}


def operator_container(objects):
    (deployment,) = by_kind(objects, "Deployment")
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    return deployment, container


def _aggregated(role):
    return any(k.startswith("rbac.authorization.k8s.io/aggregate-to-") for k in role["metadata"]["labels"])


def rules_of(objects):
    return [rule for obj in objects if obj["kind"] in {"Role", "ClusterRole"} for rule in obj["rules"]]


@pytest.mark.parametrize("name", sorted(VALUES_SETS))
def test_helm_lint_strict_passes(name, tmp_path):
    out = helm("lint", "--strict", str(CHART_DIR), *values_args(tmp_path, *VALUES_SETS[name]))
    assert "1 chart(s) linted, 0 chart(s) failed" in out


def test_operator_deployment_defaults(tmp_path):
    deployment, container = operator_container(render(tmp_path))
    spec = deployment["spec"]
    # Two replicas, one leading (Lease); the standby starts before an old pod stops.
    assert spec["replicas"] == 2
    assert spec["strategy"] == {
        "type": "RollingUpdate",
        "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0},
    }
    pod = spec["template"]["spec"]
    assert pod["serviceAccountName"] == f"{RELEASE}-eagle3-operator"
    assert pod["securityContext"]["runAsNonRoot"] is True and pod["securityContext"]["runAsUser"] != 0
    security = container["securityContext"]
    assert security["readOnlyRootFilesystem"] is True and security["allowPrivilegeEscalation"] is False
    assert security["capabilities"] == {"drop": ["ALL"]}
    assert set(container["resources"]["requests"]) == {"cpu", "memory"}
    assert container["args"] == [
        "--workers=8", "--metrics-port=8080", "--liveness-port=8081", "--leader-elect",
        f"--leader-elect-resource-name={RELEASE}-eagle3-operator", "--leader-elect-resource-namespace=eagle3-system",
        "--leader-elect-lease-duration=15", "--leader-elect-renew-deadline=10", "--leader-elect-retry-period=2",
    ]  # fmt: skip
    assert container["image"] == "ghcr.io/eagle3-ai/eagle3-operator:0.1.0"
    probe = container["livenessProbe"]["httpGet"]
    ports = {port["name"]: port["containerPort"] for port in container["ports"]}
    assert probe == {"path": "/healthz", "port": "liveness"} and ports == {"metrics": 8080, "liveness": 8081}
    env = {item["name"]: item["valueFrom"]["fieldRef"]["fieldPath"] for item in container["env"]}
    assert env == {"POD_NAME": "metadata.name"}
    # /tmp is the only writable path.
    assert [m["mountPath"] for m in container["volumeMounts"]] == ["/tmp"]


def test_cluster_wide_rbac(tmp_path):
    objects = render(tmp_path)
    cluster_roles = {role["metadata"]["name"]: role for role in by_kind(objects, "ClusterRole")}
    assert set(cluster_roles) == {
        "eagle3-eagle3-operator",
        "eagle3-eagle3-operator-discovery",
        "eagle3-eagle3-operator-runtime",
        "eagle3-eagle3-operator-edit",
        "eagle3-eagle3-operator-view",
    }
    # The only Role: the leader election Lease, in the release's namespace.
    assert [(r["metadata"]["name"], r["metadata"]["namespace"]) for r in by_kind(objects, "Role")] == [
        ("eagle3-eagle3-operator-leader-election", "eagle3-system")
    ]
    assert [b["roleRef"]["name"] for b in by_kind(objects, "RoleBinding")] == [
        "eagle3-eagle3-operator-leader-election"
    ]
    for binding in by_kind(objects, "ClusterRoleBinding"):
        assert binding["subjects"] == [
            {"kind": "ServiceAccount", "name": "eagle3-eagle3-operator", "namespace": "eagle3-system"}
        ]
    runtime = cluster_roles["eagle3-eagle3-operator-runtime"]["rules"]
    assert runtime == [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "patch"]}]
    # Cluster-wide, the runtime ServiceAccount goes to the namespaces listed in runtime.namespaces.
    assert [sa["metadata"]["name"] for sa in by_kind(objects, "ServiceAccount")] == ["eagle3-eagle3-operator"]
    objects = render(tmp_path, {"runtime": {"namespaces": ["team-c"]}})
    (runtime_sa,) = [
        sa for sa in by_kind(objects, "ServiceAccount") if sa["metadata"]["name"] == "eagle3-runtime"
    ]
    (runtime_binding,) = [
        b for b in by_kind(objects, "RoleBinding") if b["metadata"]["namespace"] == "team-c"
    ]
    assert runtime_sa["metadata"]["namespace"] == runtime_binding["metadata"]["namespace"] == "team-c"
    assert runtime_binding["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": "ClusterRole",
        "name": "eagle3-eagle3-operator-runtime",
    }


def test_namespaced_rbac_grants_nothing_outside_the_listed_namespaces(tmp_path):
    objects = render(tmp_path, NAMESPACED)
    _, container = operator_container(objects)
    assert container["args"][:2] == ["--namespace=team-a", "--namespace=team-b"]
    roles = by_kind(objects, "Role")
    assert sorted(role["metadata"]["namespace"] for role in roles) == ["eagle3-system", "team-a", "team-b"]
    bindings = by_kind(objects, "RoleBinding")
    assert sorted((b["metadata"]["namespace"], b["roleRef"]["kind"]) for b in bindings) == [
        ("eagle3-system", "Role"),  # the leader election Lease
        ("team-a", "ClusterRole"),
        ("team-a", "Role"),
        ("team-b", "ClusterRole"),
        ("team-b", "Role"),
    ]
    # Cluster-scoped rights are read-only discovery, plus the runtime role (bound per namespace only);
    # the aggregated roles are bound by no one here (they extend admin/edit/view where those are bound).
    for role in by_kind(objects, "ClusterRole"):
        if _aggregated(role):
            continue
        for rule in role["rules"]:
            assert set(rule["verbs"]) <= {"get", "list", "watch", "patch"}, rule
    (discovery_binding,) = by_kind(objects, "ClusterRoleBinding")
    assert discovery_binding["roleRef"]["name"].endswith("-discovery")
    runtime_accounts = [
        sa for sa in by_kind(objects, "ServiceAccount") if sa["metadata"]["name"] == "eagle3-runtime"
    ]
    assert sorted(sa["metadata"]["namespace"] for sa in runtime_accounts) == ["team-a", "team-b"]


@pytest.mark.parametrize("name", ["defaults", "namespaced"])
def test_rbac_is_least_privilege(name, tmp_path):
    for rule in rules_of(render(tmp_path, *VALUES_SETS[name])):
        assert "*" not in rule["apiGroups"] and "*" not in rule["resources"], rule
        assert not FORBIDDEN_VERBS & set(rule["verbs"]), rule
        assert not {"secrets", "nodes", "serviceaccounts", "rolebindings"} & set(rule["resources"]), rule
        if rule["resources"] == ["pods"]:
            assert set(rule["verbs"]) <= {"get", "list", "watch", "patch"}, (
                "pods are created by Jobs/Deployments"
            )


def test_leader_election_pdb_and_a_single_replica_without_it(tmp_path):
    objects = render(tmp_path)
    (budget,) = by_kind(objects, "PodDisruptionBudget")
    deployment, container = operator_container(objects)
    assert budget["spec"] == {"minAvailable": 1, "selector": deployment["spec"]["selector"]}
    (lease_role,) = by_kind(objects, "Role")
    assert lease_role["rules"] == [
        {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["get", "create", "update"]}
    ]
    # One replica without leader election: the old pod goes first, no budget, no Lease.
    objects = render(tmp_path, {"replicas": 1, "leaderElection": {"enabled": False}})
    deployment, container = operator_container(objects)
    assert deployment["spec"]["replicas"] == 1 and deployment["spec"]["strategy"] == {"type": "Recreate"}
    assert not [a for a in container["args"] if a.startswith("--leader-elect")]
    assert by_kind(objects, "PodDisruptionBudget") == [] and by_kind(objects, "Role") == []
    # The leader must stop before its Lease can expire.
    with pytest.raises(HelmError) as failure:
        render(tmp_path, {"leaderElection": {"renewDeadline": 20}})
    assert "retryPeriod < renewDeadline < leaseDuration" in failure.value.stderr


def test_operator_may_set_block_owner_deletion_on_its_children(tmp_path):
    """OwnerReferencesPermissionEnforcement (OpenShift) asks for `update` on the owner's finalizers."""
    for values in (VALUES_SETS["defaults"], VALUES_SETS["namespaced"]):
        rules = [
            r
            for role in by_kind(render(tmp_path, *values), "ClusterRole")
            + by_kind(render(tmp_path, *values), "Role")
            if role["metadata"]["name"] == "eagle3-eagle3-operator"
            for r in role["rules"]
        ]
        assert {
            "apiGroups": ["eagle3.ai"],
            "resources": ["drafttrainings/finalizers", "specdecodedeployments/finalizers"],
            "verbs": ["update"],
        } in rules


def test_aggregated_roles_extend_admin_edit_and_view(tmp_path):
    roles = {r["metadata"]["name"]: r for r in by_kind(render(tmp_path), "ClusterRole") if _aggregated(r)}
    edit, view = roles["eagle3-eagle3-operator-edit"], roles["eagle3-eagle3-operator-view"]
    assert {k: v for k, v in edit["metadata"]["labels"].items() if "aggregate" in k} == {
        "rbac.authorization.k8s.io/aggregate-to-admin": "true",
        "rbac.authorization.k8s.io/aggregate-to-edit": "true",
    }
    assert {k: v for k, v in view["metadata"]["labels"].items() if "aggregate" in k} == {
        "rbac.authorization.k8s.io/aggregate-to-view": "true"
    }
    assert all(set(rule["verbs"]) <= {"get", "list", "watch"} for rule in view["rules"])
    assert "create" in edit["rules"][0]["verbs"]
    assert not [
        r
        for r in by_kind(render(tmp_path, {"rbac": {"aggregateToDefaultRoles": False}}), "ClusterRole")
        if _aggregated(r)
    ]


def test_admission_policies(tmp_path):
    """By default only the runtime account's policy; allow-lists only when listed, bound to the
    watched namespaces (tests/chart/test_lockdown.py runs them on the API server)."""

    def policies(objects):
        return sorted(p["metadata"]["name"] for p in by_kind(objects, "ValidatingAdmissionPolicy"))

    assert policies(render(tmp_path)) == ["eagle3-eagle3-operator-runtime-own-pod"]
    assert policies(render(tmp_path, {"admissionPolicies": {"runtimeOwnPodOnly": False}})) == []
    objects = render(tmp_path, NAMESPACED, {"admissionPolicies": {"allowedServiceTypes": ["ClusterIP"]}})
    assert policies(objects) == [
        "eagle3-eagle3-operator-allow-lists",
        "eagle3-eagle3-operator-runtime-own-pod",
    ]
    (allow,) = [
        p for p in by_kind(objects, "ValidatingAdmissionPolicy") if p["metadata"]["name"].endswith("lists")
    ]
    assert len(allow["spec"]["validations"]) == 1  # only the list that was given
    bindings = {
        b["metadata"]["name"]: b["spec"] for b in by_kind(objects, "ValidatingAdmissionPolicyBinding")
    }
    selector = bindings["eagle3-eagle3-operator-allow-lists"]["matchResources"]["namespaceSelector"]
    assert selector["matchExpressions"][0]["values"] == ["team-a", "team-b"]
    assert "matchResources" not in bindings["eagle3-eagle3-operator-runtime-own-pod"]
    with pytest.raises(HelmError, match="allowedServiceTypes"):
        render(tmp_path, {"admissionPolicies": {"allowedServiceTypes": ["ExternalName"]}})


def test_no_rbac_and_an_existing_service_account(tmp_path):
    objects = render(tmp_path, *VALUES_SETS["no-rbac-existing-sa"])
    assert not [
        obj for obj in objects if obj["kind"] in {"Role", "ClusterRole", "RoleBinding", "ClusterRoleBinding"}
    ]
    assert by_kind(objects, "ServiceAccount") == []
    deployment, _ = operator_container(objects)
    assert deployment["spec"]["template"]["spec"]["serviceAccountName"] == "ops"


def test_monitoring_objects_are_off_by_default(tmp_path):
    kinds = {obj["kind"] for obj in render(tmp_path)}
    assert not kinds & {"ServiceMonitor", "PodMonitor", "PrometheusRule"}
    assert "ConfigMap" in kinds  # dashboards are on by default: they are inert without Grafana


def test_monitoring_objects_carry_additional_labels(tmp_path):
    objects = render(tmp_path, MONITORING_ON)
    for kind in ("ServiceMonitor", "PodMonitor", "PrometheusRule"):
        (obj,) = by_kind(objects, kind)
        assert obj["metadata"]["labels"]["release"] == "kube-prometheus-stack", kind
    (service_monitor,) = by_kind(objects, "ServiceMonitor")
    (service,) = by_kind(objects, "Service")
    selector = service_monitor["spec"]["selector"]["matchLabels"]
    assert selector.items() <= service["metadata"]["labels"].items()
    assert service_monitor["spec"]["endpoints"][0]["port"] == service["spec"]["ports"][0]["name"] == "metrics"
    # The operator's series name the namespace of the object they describe: keep that label.
    assert service_monitor["spec"]["endpoints"][0]["honorLabels"] is True
    (pod_monitor,) = by_kind(objects, "PodMonitor")
    assert pod_monitor["spec"]["namespaceSelector"] == {"any": True}
    assert pod_monitor["spec"]["selector"] == {
        "matchLabels": {"app.kubernetes.io/managed-by": "eagle3-operator"},
        "matchExpressions": [{"key": "eagle3.ai/spec-decode-deployment", "operator": "Exists"}],
    }
    relabel = {
        r["targetLabel"]: r["sourceLabels"]
        for r in pod_monitor["spec"]["podMetricsEndpoints"][0]["relabelings"]
    }
    assert relabel["specdecodedeployment"] == ["__meta_kubernetes_pod_label_eagle3_ai_spec_decode_deployment"]
    assert relabel["namespace"] == ["__meta_kubernetes_namespace"]


def test_pod_monitor_follows_watched_namespaces(tmp_path):
    (pod_monitor,) = by_kind(render(tmp_path, NAMESPACED, MONITORING_ON), "PodMonitor")
    assert pod_monitor["spec"]["namespaceSelector"] == {"matchNames": ["team-a", "team-b"]}


def test_dashboards_are_labelled_config_maps_with_valid_json(tmp_path):
    maps = by_kind(render(tmp_path, MONITORING_ON), "ConfigMap")
    assert len(maps) == 2
    titles = set()
    for config_map in maps:
        assert config_map["metadata"]["labels"]["grafana_dashboard"] == "1"
        assert config_map["metadata"]["annotations"] == {"grafana_folder": "EAGLE-3"}
        ((key, text),) = config_map["data"].items()
        dashboard = json.loads(text)
        assert key.endswith(".json") and dashboard["uid"] and dashboard["panels"]
        variables = {var["name"] for var in dashboard["templating"]["list"]}
        assert {"datasource", "namespace"} <= variables
        titles.add(dashboard["title"])
    assert titles == {"EAGLE-3 speculative decoding", "EAGLE-3 draft training and operator"}
    assert by_kind(render(tmp_path, {"grafana": {"dashboards": {"enabled": False}}}), "ConfigMap") == []


# (values, text every failure message must contain): each mistake names its field.
BAD_VALUES = [
    ({"operator": {"metricsPort": "8080"}}, "/operator/metricsPort"),
    ({"operator": {"livenessPort": 70000}}, "/operator/livenessPort"),
    ({"operator": {"workers": 0}}, "/operator/workers"),
    ({"watchNamespaces": ["Team_A"]}, "/watchNamespaces/0"),
    ({"watchNamespaces": "team-a"}, "/watchNamespaces"),
    ({"replicas": 0}, "/replicas"),
    ({"replicas": 2, "leaderElection": {"enabled": False}}, "/leaderElection/enabled"),
    ({"leaderElection": {"leaseDuration": "15s"}}, "/leaderElection/leaseDuration"),
    ({"image": {"pullPolicy": "Sometimes"}}, "/image/pullPolicy"),
    ({"resources": {"requests": {"memory": None}}}, "memory"),  # null deletes the default
    ({"prometheusRule": {"rateWindow": "5 minutes"}}, "/prometheusRule/rateWindow"),
    (
        {"prometheusRule": {"alerts": {"acceptanceLengthLow": {"threshold": 0.9}}}},
        "/prometheusRule/alerts/acceptanceLengthLow/threshold",
    ),
    (
        {"prometheusRule": {"alerts": {"acceptanceLengthLow": {"threshold": "1.0"}}}},
        "/prometheusRule/alerts/acceptanceLengthLow/threshold",
    ),
    (
        {"prometheusRule": {"alerts": {"trainingStalled": {"stalledAfterSeconds": 10}}}},
        "/prometheusRule/alerts/trainingStalled/stalledAfterSeconds",
    ),
    (
        {"prometheusRule": {"alerts": {"servingUnavailable": {"severity": "page"}}}},
        "/prometheusRule/alerts/servingUnavailable/severity",
    ),
    (
        {"metrics": {"serviceMonitor": {"additionalLabels": {"release": 1}}}},
        "/metrics/serviceMonitor/additionalLabels/release",
    ),
    ({"grafana": {"dashboards": {"labelValue": 1}}}, "/grafana/dashboards/labelValue"),
    ({"operator": {"verbose": "yes"}}, "/operator/verbose"),
    ({"runtime": {"image": {"repository": "x"}}}, "image"),  # the runtime image is per DraftTraining
]


@pytest.mark.parametrize(("values", "field"), BAD_VALUES, ids=[field for _, field in BAD_VALUES])
def test_schema_violations_fail_with_a_message_naming_the_field(values, field, tmp_path):
    with pytest.raises(HelmError) as failure:
        render(tmp_path, values)
    message = failure.value.stderr
    assert "values don't meet the specifications of the schema" in message, message
    assert field in message, message


def test_threshold_given_with_helm_set_is_accepted(tmp_path):
    """`helm --set x=2.5` passes a string: the schema takes numeric strings above 1 too."""
    (rule,) = by_kind(
        render(
            tmp_path,
            {"prometheusRule": {"enabled": True, "alerts": {"acceptanceLengthLow": {"threshold": "2.5"}}}},
        ),
        "PrometheusRule",
    )
    (low,) = [
        r for g in rule["spec"]["groups"] for r in g["rules"] if r.get("alert") == "Eagle3AcceptanceLengthLow"
    ]
    assert low["expr"].endswith("< 2.5")


def test_service_monitor_without_the_service_fails_clearly(tmp_path):
    values = {"metrics": {"service": {"enabled": False}, "serviceMonitor": {"enabled": True}}}
    with pytest.raises(HelmError) as failure:
        render(tmp_path, values)
    assert "metrics.serviceMonitor.enabled needs metrics.service.enabled" in failure.value.stderr
