"""A small Kubernetes REST client on top of the kubernetes package, counting every request it makes.

Plain dicts in and out (the planners work on dicts), and one place that knows resource paths.
"""

from __future__ import annotations

import contextlib
import json
import threading
from collections import Counter
from collections.abc import Callable
from typing import Any

from kubernetes import client, config

from eagle3_api import API_VERSION
from eagle3_operator import metrics

FIELD_MANAGER = "eagle3-operator"
WRITE_VERBS = ("create", "patch", "apply", "delete")
RESOURCES = {
    ("v1", "PersistentVolumeClaim"): "persistentvolumeclaims",
    ("v1", "Service"): "services",
    ("v1", "Pod"): "pods",
    ("v1", "Event"): "events",
    ("coordination.k8s.io/v1", "Lease"): "leases",
    ("apps/v1", "Deployment"): "deployments",
    ("batch/v1", "Job"): "jobs",
    ("policy/v1", "PodDisruptionBudget"): "poddisruptionbudgets",
    ("networking.k8s.io/v1", "NetworkPolicy"): "networkpolicies",
    ("monitoring.coreos.com/v1", "ServiceMonitor"): "servicemonitors",
    ("monitoring.coreos.com/v1", "PodMonitor"): "podmonitors",
    (API_VERSION, "DraftTraining"): "drafttrainings",
    (API_VERSION, "SpecDecodeDeployment"): "specdecodedeployments",
}


class ApiError(Exception):
    def __init__(self, status: int, message: str, detail: str = ""):
        super().__init__(message)
        self.status = status
        # The API server's own words (the Status object's message), for conditions and Events.
        self.detail = detail or message


def status_message(text: str) -> str:
    """The `message` of a Kubernetes Status body; the text itself when it is not one."""
    try:
        body = json.loads(text)
    except ValueError:
        return text.strip()
    return str(body.get("message") or text).strip() if isinstance(body, dict) else text.strip()


class NamespaceTerminating(ApiError):
    """A write into a namespace that is being deleted: nothing to reconcile there any more."""


class Conflict(ApiError):
    """409: the object changed since it was read (a resourceVersion precondition failed), or exists."""


class NotLeader(Exception):
    """A write attempted by a replica that does not hold the leader Lease; nothing was sent."""


class NotFound(ApiError):
    def __init__(self, path: str):
        super().__init__(404, f"not found: {path}")


def load_api_client(connections: int | None = None) -> client.ApiClient:
    """In-cluster credentials when running in a pod, else the kubeconfig (KUBECONFIG or ~/.kube/config).

    `connections`: the connections kept open to the API server, one per thread that may call it at
    once. The client's default is 5 per CPU the host reports; when fewer than the callers, each
    request over it opens a TLS connection and drops it after one use.
    """
    try:
        config.load_incluster_config()
    except config.ConfigException:
        config.load_kube_config()
    configuration = client.Configuration.get_default_copy()
    if connections is not None:
        configuration.connection_pool_maxsize = connections
    return client.ApiClient(configuration)


def resource_path(api_version: str, kind: str, namespace: str, name: str | None = None, sub: str = "") -> str:
    root = "/api/v1" if api_version == "v1" else f"/apis/{api_version}"
    path = f"{root}/namespaces/{namespace}/{RESOURCES[(api_version, kind)]}"
    if name:
        path += f"/{name}"
    if sub:
        path += f"/{sub}"
    return path


class Kube:
    def __init__(self, api_client: client.ApiClient | None = None):
        self.api = api_client or load_api_client()
        self._lock = threading.Lock()
        self.requests: Counter[str] = Counter()  # verb -> count, for tests and benchmarks
        # Leader election's fence: writes go out only while this is true (None: always).
        self.may_write: Callable[[], bool] | None = None

    @property
    def writes(self) -> int:
        with self._lock:
            return sum(self.requests[v] for v in WRITE_VERBS)

    def _call(
        self,
        verb: str,
        method: str,
        path: str,
        *,
        body: Any = None,
        query: list[tuple[str, str]] | None = None,
        content_type: str = "application/json",
    ) -> dict[str, Any]:
        if verb in WRITE_VERBS and self.may_write is not None and not self.may_write():
            raise NotLeader(f"{method} {path}: this replica does not hold the leader Lease")
        with self._lock:
            self.requests[verb] += 1
        metrics.API_REQUESTS.labels(verb).inc()
        headers = {"Accept": "application/json", "Content-Type": content_type}
        method, url, headers, body, _ = self.api.param_serialize(
            method=method,
            resource_path=path,
            query_params=query or [],
            header_params=headers,
            body=body,
            auth_settings=["BearerToken"],
        )
        with metrics.API_REQUEST_SECONDS.labels(verb).time():
            response = self.api.call_api(method, url, header_params=headers, body=body, _request_timeout=60)
            data = response.read()
        if response.status == 404:
            raise NotFound(path)
        if not 200 <= response.status < 300:
            text = data.decode(errors="replace")
            error = ApiError
            if response.status == 403 and "NamespaceTerminating" in text:
                error = NamespaceTerminating
            elif response.status == 409:
                error = Conflict
            raise error(response.status, f"{method} {path}: {text[:2000]}", status_message(text)[:2000])
        return json.loads(data) if data else {}

    def get(self, api_version: str, kind: str, namespace: str, name: str) -> dict[str, Any] | None:
        try:
            return self._call("get", "GET", resource_path(api_version, kind, namespace, name))
        except NotFound:
            return None

    def list(
        self, api_version: str, kind: str, namespace: str, selector: str = "", fields: str = ""
    ) -> list[dict[str, Any]]:
        """Objects matching a label selector and/or a field selector."""
        query = [(k, v) for k, v in (("labelSelector", selector), ("fieldSelector", fields)) if v]
        result = self._call("list", "GET", resource_path(api_version, kind, namespace), query=query)
        return result.get("items") or []

    def create(self, obj: dict[str, Any]) -> dict[str, Any] | None:
        """Create with the operator's field manager; None when it exists already (a concurrent
        reconcile made it)."""
        path = resource_path(obj["apiVersion"], obj["kind"], obj["metadata"]["namespace"])
        try:
            return self._call("create", "POST", path, body=obj, query=[("fieldManager", FIELD_MANAGER)])
        except Conflict:
            return None

    def apply_created(self, obj: dict[str, Any]) -> dict[str, Any]:
        """Server-side apply to a child this operator created, once its fields are the apply's.

        A child is created by POST (server-side apply costs the API server about twice as much to
        create one: docs/benchmarks.md, the floor). The fields set then belong to the operator's
        field manager as an `Update` entry, and an apply would only share them: a field dropped from
        a later apply would stay. So before the first apply that entry becomes the manager's `Apply`
        entry, as kubectl's upgrade from client-side to server-side apply does."""
        for _ in range(3):  # the entries may move between the read and the patch: read again
            try:
                self._own_created_fields(obj)
                break
            except ApiError as error:
                if error.status != 422:  # 422: the patch's test of the entry failed
                    raise
        return self.apply(obj)

    def _own_created_fields(self, obj: dict[str, Any]) -> None:
        meta = obj["metadata"]
        live = self.get(obj["apiVersion"], obj["kind"], meta["namespace"], meta["name"])
        entries = (live or {"metadata": {}})["metadata"].get("managedFields") or []
        ours = [
            i for i, e in enumerate(entries) if e.get("manager") == FIELD_MANAGER and not e.get("subresource")
        ]
        if not ours or any(entries[i].get("operation") == "Apply" for i in ours):
            return
        entry = f"/metadata/managedFields/{ours[0]}"
        self._call(
            "patch",
            "PATCH",
            resource_path(obj["apiVersion"], obj["kind"], meta["namespace"], meta["name"]),
            body=[
                {"op": "test", "path": f"{entry}/manager", "value": FIELD_MANAGER},
                {"op": "test", "path": f"{entry}/operation", "value": "Update"},
                {"op": "replace", "path": f"{entry}/operation", "value": "Apply"},
            ],
            content_type="application/json-patch+json",
        )

    def apply(self, obj: dict[str, Any]) -> dict[str, Any]:
        """Server-side apply with the operator's field manager (creates when missing)."""
        meta = obj["metadata"]
        path = resource_path(obj["apiVersion"], obj["kind"], meta["namespace"], meta["name"])
        query = [("fieldManager", FIELD_MANAGER), ("force", "true")]
        return self._call(
            "apply", "PATCH", path, body=obj, query=query, content_type="application/apply-patch+yaml"
        )

    def patch_status(
        self,
        api_version: str,
        kind: str,
        namespace: str,
        name: str,
        status: dict[str, Any],
        resource_version: str,
    ) -> dict[str, Any]:
        """Merge-patch the status of the object as it was at `resource_version`; Conflict when it has
        changed since (the API server checks a resourceVersion in the patch as a precondition)."""
        path = resource_path(api_version, kind, namespace, name, "status")
        body = {"metadata": {"resourceVersion": resource_version}, "status": status}
        return self._call("patch", "PATCH", path, body=body, content_type="application/merge-patch+json")

    def delete(self, api_version: str, kind: str, namespace: str, name: str) -> None:
        path = resource_path(api_version, kind, namespace, name)
        with contextlib.suppress(NotFound):
            self._call("delete", "DELETE", path, body={"propagationPolicy": "Background"})

    def post_event(self, event: dict[str, Any]) -> None:
        self._call("create", "POST", resource_path("v1", "Event", event["metadata"]["namespace"]), body=event)

    # Leader election: counted as verb "lease", apart from the writes to the objects the operator manages.
    def get_lease(self, namespace: str, name: str) -> dict[str, Any] | None:
        try:
            return self._call(
                "lease", "GET", resource_path("coordination.k8s.io/v1", "Lease", namespace, name)
            )
        except NotFound:
            return None

    def create_lease(self, lease: dict[str, Any]) -> dict[str, Any]:
        path = resource_path("coordination.k8s.io/v1", "Lease", lease["metadata"]["namespace"])
        return self._call("lease", "POST", path, body=lease)

    def update_lease(self, lease: dict[str, Any]) -> dict[str, Any]:
        """PUT: the Lease's resourceVersion makes it a compare-and-swap (Conflict when another won)."""
        meta = lease["metadata"]
        path = resource_path("coordination.k8s.io/v1", "Lease", meta["namespace"], meta["name"])
        return self._call("lease", "PUT", path, body=lease)

    def served_kinds(self, api_version: str) -> set[str]:
        """Kinds the API server serves in a group version; empty when the group is not installed."""
        try:
            result = self._call("discovery", "GET", f"/apis/{api_version}")
        except ApiError:
            return set()
        return {r["kind"] for r in result.get("resources") or [] if "/" not in r["name"]}
