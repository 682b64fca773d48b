"""Talking to the test bed's API server as its admin: REST calls, kubectl, the kubernetes client,
namespaces, tokens, and ending pods the way a kubelet would. `LocalCluster` (tests/support/cluster.py,
which starts and stops the processes) is a `KubeApi`; tests import these names from there."""

from __future__ import annotations

import json
import os
import ssl
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import yaml

from tests.support import testbed_kwok

T = TypeVar("T")
MAX_TERMINATION_MESSAGE_BYTES = 4096  # what the kubelet keeps of /dev/termination-log


class ApiError(RuntimeError):
    def __init__(self, method: str, path: str, status: int, body: str) -> None:
        try:
            reason = json.loads(body).get("message", body)
        except ValueError:
            reason = body
        super().__init__(f"{method} {path} -> HTTP {status}: {reason}")
        self.status = status
        self.body = body


class KubectlError(RuntimeError):
    def __init__(self, args: list[str], returncode: int, stderr: str) -> None:
        super().__init__(f"kubectl {' '.join(args)} failed ({returncode}): {stderr.strip()}")
        self.returncode = returncode
        self.stderr = stderr


def wait_until(
    predicate: Callable[[], T], *, timeout: float = 30.0, interval: float = 0.1, what: str = "condition"
) -> T:
    """Poll predicate until it returns something truthy (returned); TimeoutError after timeout seconds."""
    deadline = time.monotonic() + timeout
    while True:
        result = predicate()
        if result:
            return result
        if time.monotonic() >= deadline:
            raise TimeoutError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(interval)


def open_local(request: str | urllib.request.Request, context: ssl.SSLContext | None, timeout: float):
    """urlopen that never goes through an HTTP(S)_PROXY from the environment: all is on this machine."""
    handlers: list[urllib.request.BaseHandler] = [urllib.request.ProxyHandler({})]
    if context is not None:
        handlers.append(urllib.request.HTTPSHandler(context=context))
    return urllib.request.build_opener(*handlers).open(request, timeout=timeout)


def with_local_hosts(no_proxy: str | None, *hosts: str) -> str:
    return ",".join(entry for entry in (no_proxy, "127.0.0.1", "localhost", *hosts) if entry)


class KubeApi:
    """Admin access to one API server; the subclass sets where it is once it has started it."""

    server: str  # "https://HOST:PORT"
    kubeconfig: Path  # admin kubeconfig (system:masters)
    ca_file: Path  # CA of the API server's serving certificate
    bin_dir: Path  # with kubectl
    _admin_ssl: ssl.SSLContext | None  # the admin client certificate, for request()

    def env(self) -> dict[str, str]:
        """Environment for subprocesses (operator, helm, kubectl) that should talk to this cluster."""
        no_proxy = with_local_hosts(os.environ.get("NO_PROXY") or os.environ.get("no_proxy"), self._api_host)
        return {
            **os.environ,
            "KUBECONFIG": str(self.kubeconfig),
            "PATH": f"{self.bin_dir}{os.pathsep}{os.environ.get('PATH', '')}",
            # Python clients (kubernetes, aiohttp) would send even loopback through an HTTP(S)_PROXY.
            "NO_PROXY": no_proxy,
            "no_proxy": no_proxy,
        }

    @property
    def _api_host(self) -> str:
        return urllib.parse.urlsplit(self.server).hostname or ""

    def request(self, method: str, path: str, body: dict | None = None, content_type: str = "") -> dict:
        """One admin call to the API server (no client library: fast to start, used while polling).

        path is e.g. "/api/v1/nodes"; body is sent as JSON (content_type defaults to
        application/json, or application/merge-patch+json for PATCH). Raises ApiError on HTTP errors.
        """
        data = json.dumps(body).encode() if body is not None else None
        headers = {"Accept": "application/json"}
        if data is not None:
            headers["Content-Type"] = content_type or (
                "application/merge-patch+json" if method == "PATCH" else "application/json"
            )
        req = urllib.request.Request(self.server + path, data=data, method=method, headers=headers)
        try:
            with open_local(req, self._admin_ssl, timeout=30) as response:
                return json.load(response)
        except urllib.error.HTTPError as error:
            raise ApiError(method, path, error.code, error.read().decode(errors="replace")) from None

    def kubectl(self, *args: str, input: str | None = None, check: bool = True, timeout: float = 60) -> str:
        """Run kubectl as admin; returns stdout, raises KubectlError (with stderr) if check and it fails."""
        argv = [str(a) for a in args]
        result = subprocess.run(
            [str(self.bin_dir / "kubectl"), f"--kubeconfig={self.kubeconfig}", *argv],
            input=input,
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        if check and result.returncode != 0:
            raise KubectlError(argv, result.returncode, result.stderr)
        return result.stdout

    def api_client(self, token: str | None = None) -> Any:
        """A new kubernetes.client.ApiClient (close it, or use it as a context manager).

        Admin (client certificate) by default; with `token`, it authenticates with that bearer token
        instead, e.g. one from service_account_token().
        """
        from kubernetes import client, config

        configuration = client.Configuration()
        if token is None:
            config.load_kube_config(config_file=str(self.kubeconfig), client_configuration=configuration)
        else:
            configuration.host = self.server
            configuration.ssl_ca_cert = str(self.ca_file)
            configuration.api_key = {"authorization": f"Bearer {token}"}
        configuration.no_proxy = with_local_hosts(configuration.no_proxy, self._api_host)
        return client.ApiClient(configuration)

    def apply(self, manifest: dict | list[dict] | str, namespace: str | None = None) -> str:
        """kubectl apply (server-side) of one object, a list of objects, or YAML text."""
        if isinstance(manifest, dict):
            text = yaml.safe_dump(manifest)
        elif isinstance(manifest, list):
            text = yaml.safe_dump_all(manifest)
        else:
            text = manifest
        args = ["apply", "--server-side", "--field-manager=eagle3-tests", "-f", "-"]
        if namespace:
            args += ["-n", namespace]
        return self.kubectl(*args, input=text)

    def create_namespace(self, name: str | None = None, *, manual: bool = False) -> str:
        """Create a namespace (random name unless given) and wait for its default ServiceAccount.

        manual=True gives it the prefix that stops kwok from ending Job pods in it (see module doc).
        """
        manual_prefix = testbed_kwok.MANUAL_NAMESPACE_PREFIX
        name = name or f"{manual_prefix if manual else 'test-'}{uuid.uuid4().hex[:8]}"
        if manual != name.startswith(manual_prefix):
            rule = "must" if manual else "may not"
            raise ValueError(
                f"namespace {name!r}: a {'' if manual else 'non-'}manual one {rule} start with {manual_prefix!r}"
            )
        self.request("POST", "/api/v1/namespaces", {"metadata": {"name": name}})
        # Pods are refused until the ServiceAccount controller has created "default".
        wait_until(lambda: self._default_service_account(name), timeout=30, what=f"default SA in {name}")
        return name

    def delete_namespace(self, name: str, *, wait: bool = False, timeout: float = 60) -> None:
        """Delete a namespace (its content goes with it); wait=True blocks until it is gone."""
        try:
            self.request("DELETE", f"/api/v1/namespaces/{name}")
        except ApiError as error:
            if error.status != 404:
                raise
        if wait:
            wait_until(
                lambda: not self._exists(f"/api/v1/namespaces/{name}"), timeout=timeout, what=f"{name} gone"
            )

    def describe_namespace(self, namespace: str) -> str:
        """What a failed test leaves to read: the namespace's workloads, its Events, and the last log
        lines of every pod that did not succeed."""
        parts = [
            self.kubectl("get", "dt,sdd,deploy,job,pod", "-n", namespace, "-o", "wide", check=False),
            self.kubectl("get", "events", "-n", namespace, "--sort-by=.lastTimestamp", check=False),
        ]
        for pod in self.request("GET", f"/api/v1/namespaces/{namespace}/pods")["items"]:
            if pod["status"].get("phase") != "Succeeded":
                name = pod["metadata"]["name"]
                logs = self.kubectl("logs", "-n", namespace, name, "--tail=40", check=False)
                parts.append(f"--- {name} ({pod['status'].get('phase')}) ---\n{logs}")
        return "\n".join(parts)

    def _exists(self, path: str) -> bool:
        try:
            self.request("GET", path)
        except ApiError as error:
            if error.status == 404:
                return False
            raise
        return True

    def service_account_token(self, namespace: str, name: str, expiration_s: int = 600) -> str:
        """A token for the ServiceAccount from the TokenRequest API (what a projected volume holds)."""
        request = {
            "apiVersion": "authentication.k8s.io/v1",
            "kind": "TokenRequest",
            "spec": {"expirationSeconds": expiration_s},
        }
        path = f"/api/v1/namespaces/{namespace}/serviceaccounts/{name}/token"
        return self.request("POST", path, request)["status"]["token"]

    # ---- driving pods ----------------------------------------------------------------------------

    def complete_pod(
        self, namespace: str, name: str, *, message: str = "", container: str | None = None
    ) -> dict:
        """End a Running pod with phase Succeeded; `message` becomes the container's termination message."""
        return self._end_pod(namespace, name, "Succeeded", 0, "Completed", message, container)

    def fail_pod(
        self,
        namespace: str,
        name: str,
        *,
        message: str = "",
        exit_code: int = 1,
        reason: str = "Error",
        container: str | None = None,
    ) -> dict:
        """End a Running pod with phase Failed; the container exits with exit_code and `message`."""
        if exit_code == 0:
            raise ValueError("a failed container has a non-zero exit code")
        return self._end_pod(namespace, name, "Failed", exit_code, reason, message, container)

    def _end_pod(
        self,
        namespace: str,
        name: str,
        phase: str,
        exit_code: int,
        reason: str,
        message: str,
        container: str | None,
        timeout: float = 30,
    ) -> dict:
        if len(message.encode()) > MAX_TERMINATION_MESSAGE_BYTES:
            raise ValueError(
                f"termination message is {len(message.encode())} bytes; the kubelet keeps at most "
                f"{MAX_TERMINATION_MESSAGE_BYTES}"
            )

        def running_pod() -> dict | None:
            pod = self.request("GET", f"/api/v1/namespaces/{namespace}/pods/{name}")
            return pod if pod.get("status", {}).get("phase") == "Running" else None

        pod = wait_until(running_pod, timeout=timeout, what=f"pod {namespace}/{name} to be Running")
        owners = {ref["kind"] for ref in pod["metadata"].get("ownerReferences", [])}
        if "Job" in owners and not testbed_kwok.is_manual(pod):
            raise ValueError(
                f"pod {namespace}/{name} belongs to a Job and kwok ends it by itself; create its namespace "
                f"with create_namespace(manual=True) or label the pod {testbed_kwok.MANUAL_LABEL}=true"
            )
        containers = [c["name"] for c in pod["spec"]["containers"]]
        target = container or containers[0]
        if target not in containers:
            raise ValueError(f"pod {namespace}/{name} has no container {target!r} (has {containers})")
        now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        started = pod["status"].get("startTime", now)
        images = {c["name"]: c["image"] for c in pod["spec"]["containers"]}

        def terminated(container_name: str) -> dict:
            state = {"exitCode": 0, "reason": "Completed", "startedAt": started, "finishedAt": now}
            if container_name == target:
                state.update(exitCode=exit_code, reason=reason)
                if message:
                    state["message"] = message
            return {
                "name": container_name,
                "image": images[container_name],
                "imageID": "",
                "ready": False,
                "started": False,
                "restartCount": 0,
                "state": {"terminated": state},
            }

        patch = {
            "status": {
                "phase": phase,
                "conditions": [
                    {"type": t, "status": "False", "reason": "PodCompleted", "lastTransitionTime": now}
                    for t in ("Ready", "ContainersReady")
                ]
                + [
                    c
                    for c in pod["status"].get("conditions", [])
                    if c["type"] not in ("Ready", "ContainersReady")
                ],
                "containerStatuses": [terminated(c) for c in containers],
            }
        }
        return self.request("PATCH", f"/api/v1/namespaces/{namespace}/pods/{name}/status", patch)

    def _default_service_account(self, namespace: str) -> bool:
        return self._exists(f"/api/v1/namespaces/{namespace}/serviceaccounts/default")
