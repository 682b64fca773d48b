"""The test bed's real node runs pods for real (tests/support/realnode.py).

Every pod here is started by a real kubelet through containerd and runc, gets its address from the
CNI bridge plugin, reaches Services through kube-proxy's rules and names through CoreDNS, and is
reported by the kubelet itself. The one stand-in is the GPU device plugin: there is no GPU here, so
hack/testbed/node/amdgpu-device-plugin registers `amd.com/gpu` through the kubelet's real
device-plugin API and hands out device ids instead of /dev/kfd and /dev/dri. (Volumes of the
real-node-local class are created by the test bed's own provisioning loop, standing in for an
external provisioner; binding, mounting and fsGroup are Kubernetes' own.)
"""

from __future__ import annotations

import ipaddress
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from eagle3_api.common import DEFAULT_VLLM_IMAGE
from eagle3_api.draft_training import DEFAULT_RUNTIME_IMAGE
from tests.support import realnode
from tests.support.cluster import REPO_ROOT, LocalCluster, find_bin_dir, wait_until
from tests.support.testbed_kwok import GPU_NODE_LABELS, GPU_RESOURCE

POD_TIMEOUT_S = 90


def pod(name: str, script: str, *, image: str = DEFAULT_RUNTIME_IMAGE, **container: object) -> dict:
    """A pod for the real node running `sh -c script`, stopped at once when deleted."""
    spec = {
        "restartPolicy": "Never",
        "terminationGracePeriodSeconds": 1,
        "containers": [
            {
                "name": "main",
                "image": image,
                "imagePullPolicy": "Never",
                "command": ["sh", "-c", script],
                **container,
            }
        ],
    }
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": realnode.on_real_node(spec),
    }


def create(cluster: LocalCluster, namespace: str, manifest: dict) -> None:
    kind = manifest["kind"].lower() + "s"
    group = "/api/v1" if manifest["apiVersion"] == "v1" else f"/apis/{manifest['apiVersion']}"
    cluster.request("POST", f"{group}/namespaces/{namespace}/{kind}", manifest)


def get_pod(cluster: LocalCluster, namespace: str, name: str) -> dict:
    return cluster.request("GET", f"/api/v1/namespaces/{namespace}/pods/{name}")


def finished(cluster: LocalCluster, namespace: str, name: str, timeout: float = POD_TIMEOUT_S) -> dict:
    """The pod once the kubelet reports it Succeeded or Failed."""

    def done() -> dict | None:
        current = get_pod(cluster, namespace, name)
        return current if current["status"].get("phase") in ("Succeeded", "Failed") else None

    return wait_until(done, timeout=timeout, interval=0.5, what=f"pod {namespace}/{name} to finish")


def terminated(pod_status: dict) -> dict:
    return pod_status["status"]["containerStatuses"][0]["state"]["terminated"]


def conditions(pod_status: dict) -> dict[str, str]:
    return {c["type"]: c["status"] for c in pod_status["status"].get("conditions", [])}


def test_node_is_real_tainted_and_labelled_like_an_amd_gpu_node(cluster):
    node = cluster.request("GET", f"/api/v1/nodes/{realnode.NODE_NAME}")
    info = node["status"]["nodeInfo"]

    assert info["kubeletVersion"] == cluster.request("GET", "/version")["gitVersion"] == "v1.36.3"
    assert info["containerRuntimeVersion"] == "containerd://2.3.7"
    assert realnode.REAL_NODE_TAINT in [
        {k: t[k] for k in ("key", "value", "effect")} for t in node["spec"]["taints"]
    ]
    labels = node["metadata"]["labels"]
    assert labels[realnode.REAL_NODE_LABEL] == "true"
    assert labels["amd.com/gpu.product-name"] == GPU_NODE_LABELS["amd.com/gpu.product-name"]
    assert labels.items() >= realnode.NODE_LABELS.items()
    # The stand-in device plugin's devices, counted by the kubelet's device manager.
    assert node["status"]["capacity"][GPU_RESOURCE] == node["status"]["allocatable"][GPU_RESOURCE] == "4"
    assert {"type": "InternalIP", "address": cluster.real_node.node_ip} in node["status"]["addresses"]


def test_pod_runs_and_its_termination_message_and_logs_are_read_back(cluster, real_node_namespace):
    ns = real_node_namespace
    create(cluster, ns, pod("ok", "echo to the log; printf 'all done' > /dev/termination-log"))
    failing = pod(
        "fails",
        "echo first; echo 'the last words' ; exit 3",
        terminationMessagePolicy="FallbackToLogsOnError",
    )
    create(cluster, ns, failing)

    ok = finished(cluster, ns, "ok")
    assert ok["status"]["phase"] == "Succeeded"
    assert terminated(ok)["exitCode"] == 0
    assert terminated(ok)["message"] == "all done"
    assert ipaddress.ip_address(ok["status"]["podIP"]) in ipaddress.ip_network(cluster.real_node.pod_cidr)
    # kubectl logs goes API server -> kubelet (its serving certificate, the API server's client one).
    assert cluster.kubectl("logs", "-n", ns, "ok") == "to the log\n"

    failed = finished(cluster, ns, "fails")
    assert failed["status"]["phase"] == "Failed"
    assert terminated(failed)["exitCode"] == 3
    assert terminated(failed)["reason"] == "Error"
    assert terminated(failed)["message"] == "first\nthe last words\n"


def test_env_expansion_and_downward_api(cluster, real_node_namespace):
    ns = real_node_namespace
    report = (
        "import json, os; env = {k: os.environ.get(k) for k in "
        "('GREETING', 'EXPANDED', 'ESCAPED', 'UNDEFINED', 'POD_NAME', 'POD_NAMESPACE', 'NODE_NAME', 'POD_IP', "
        "'MEMORY_MI')}; env['labels'] = open('/etc/podinfo/labels').read(); env['arg'] = os.sys.argv[1]; "
        "open('/dev/termination-log', 'w').write(json.dumps(env))"
    )
    manifest = pod("env", "", image=DEFAULT_RUNTIME_IMAGE)
    container = manifest["spec"]["containers"][0]
    container["command"] = ["python", "-c", report, "$(GREETING) from args"]
    container["env"] = [
        {"name": "GREETING", "value": "hello"},
        {"name": "EXPANDED", "value": "$(GREETING), world"},
        {"name": "ESCAPED", "value": "$$(GREETING)"},
        {"name": "UNDEFINED", "value": "$(NOT_SET)"},
        {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
        {"name": "POD_NAMESPACE", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
        {"name": "NODE_NAME", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
        {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
        {
            "name": "MEMORY_MI",
            "valueFrom": {"resourceFieldRef": {"resource": "requests.memory", "divisor": "1Mi"}},
        },
    ]
    container["resources"] = {"requests": {"memory": "64Mi"}}
    container["volumeMounts"] = [{"name": "podinfo", "mountPath": "/etc/podinfo"}]
    manifest["metadata"]["labels"] = {"app": "env-check"}
    manifest["spec"]["volumes"] = [
        {
            "name": "podinfo",
            "downwardAPI": {"items": [{"path": "labels", "fieldRef": {"fieldPath": "metadata.labels"}}]},
        }
    ]
    create(cluster, ns, manifest)

    done = finished(cluster, ns, "env")
    assert done["status"]["phase"] == "Succeeded", done["status"]
    env = json.loads(terminated(done)["message"])
    assert env == {
        "GREETING": "hello",
        "EXPANDED": "hello, world",
        "ESCAPED": "$(GREETING)",
        "UNDEFINED": "$(NOT_SET)",
        "POD_NAME": "env",
        "POD_NAMESPACE": ns,
        "NODE_NAME": realnode.NODE_NAME,
        "POD_IP": done["status"]["podIP"],
        "MEMORY_MI": "64",
        "labels": 'app="env-check"',
        "arg": "hello from args",
    }


def claim(name: str) -> dict:
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {"name": name},
        "spec": {
            "storageClassName": realnode.STORAGE_CLASS,
            "accessModes": ["ReadWriteOnce"],
            "resources": {"requests": {"storage": "1Gi"}},
        },
    }


def test_non_root_pod_writes_a_fresh_volume_only_with_fs_group(cluster, real_node_namespace):
    ns = real_node_namespace
    write = "id -G; stat -c '%u:%g %a' /data; echo hello > /data/out.txt && echo written"
    for name, security in (("with-fsgroup", {"fsGroup": 2000}), ("without-fsgroup", {})):
        create(cluster, ns, claim(name))
        manifest = pod(name, write, volumeMounts=[{"name": "data", "mountPath": "/data"}])
        manifest["spec"]["securityContext"] = {"runAsUser": 1000, "runAsGroup": 1000, **security}
        manifest["spec"]["volumes"] = [{"name": "data", "persistentVolumeClaim": {"claimName": name}}]
        create(cluster, ns, manifest)

    with_group = finished(cluster, ns, "with-fsgroup")
    logs = cluster.kubectl("logs", "-n", ns, "with-fsgroup").splitlines()
    assert with_group["status"]["phase"] == "Succeeded", logs
    assert logs[0].split() == ["1000", "2000"], "fsGroup is a supplementary group"
    assert logs[1] == "0:2000 2775", "the kubelet gave the volume to the fsGroup (setgid, group-writable)"
    assert logs[2] == "written"

    # A fresh volume belongs to root, as a new filesystem does: without fsGroup uid 1000 cannot write.
    without = finished(cluster, ns, "without-fsgroup")
    logs = cluster.kubectl("logs", "-n", ns, "without-fsgroup")
    assert without["status"]["phase"] == "Failed"
    assert "0:0 755" in logs and "Permission denied" in logs, logs

    bound = cluster.request("GET", f"/api/v1/namespaces/{ns}/persistentvolumeclaims/with-fsgroup")
    volume = cluster.request("GET", f"/api/v1/persistentvolumes/{bound['spec']['volumeName']}")
    path = Path(volume["spec"]["local"]["path"])
    assert (path / "out.txt").read_text() == "hello\n"
    assert (path / "out.txt").stat().st_uid == 1000 and (path / "out.txt").stat().st_gid == 2000
    # Claim deleted -> the provisioner deletes the Released volume and its directory.
    cluster.request("DELETE", f"/api/v1/namespaces/{ns}/pods/with-fsgroup")
    cluster.request("DELETE", f"/api/v1/namespaces/{ns}/persistentvolumeclaims/with-fsgroup")
    wait_until(lambda: not path.exists(), timeout=60, interval=0.5, what="the released volume to be deleted")


def test_host_directory_reaches_a_pod_read_only_through_a_bound_claim(cluster, real_node_namespace, tmp_path):
    ns = real_node_namespace
    model = tmp_path / "model"
    model.mkdir(mode=0o755)
    (model / "config.json").write_text('{"architectures": ["LlamaForCausalLM"]}')
    cluster.real_node.host_path_claim(cluster, ns, "models", model)
    manifest = pod(
        "reader",
        "cat /models/config.json; echo; touch /models/new 2>&1 || true",
        volumeMounts=[{"name": "models", "mountPath": "/models", "readOnly": True}],
    )
    manifest["spec"]["volumes"] = [{"name": "models", "persistentVolumeClaim": {"claimName": "models"}}]
    create(cluster, ns, manifest)

    done = finished(cluster, ns, "reader")
    logs = cluster.kubectl("logs", "-n", ns, "reader").splitlines()
    assert done["status"]["phase"] == "Succeeded", logs
    assert logs[0] == '{"architectures": ["LlamaForCausalLM"]}'
    assert "Read-only file system" in logs[1]
    assert not (model / "new").exists()


def test_readiness_probe_gates_ready(cluster, real_node_namespace):
    ns = real_node_namespace
    probe = {"exec": {"command": ["cat", "/tmp/ready"]}, "periodSeconds": 1, "failureThreshold": 1}
    manifest = pod("probed", "sleep 3; touch /tmp/ready; exec sleep 600", readinessProbe=probe)
    create(cluster, ns, manifest)

    running = wait_until(
        lambda: (current := get_pod(cluster, ns, "probed"))["status"].get("phase") == "Running" and current,
        timeout=POD_TIMEOUT_S,
        what="the probed pod to run",
    )
    assert conditions(running)["Ready"] == "False", "running, but the probe's file is not there yet"
    wait_until(
        lambda: conditions(get_pod(cluster, ns, "probed"))["Ready"] == "True",
        timeout=30,
        interval=0.2,
        what="Ready",
    )
    status = get_pod(cluster, ns, "probed")["status"]
    started = status["containerStatuses"][0]["state"]["running"]["startedAt"]
    ready_at = next(c["lastTransitionTime"] for c in status["conditions"] if c["type"] == "Ready")
    assert _seconds(ready_at) - _seconds(started) >= 3


def _seconds(timestamp: str) -> float:
    return time.mktime(time.strptime(timestamp, "%Y-%m-%dT%H:%M:%SZ"))


def test_pod_reaches_another_pod_through_service_ip_and_dns(cluster, real_node_namespace):
    ns = real_node_namespace
    server = pod(
        "web",
        'mkdir /tmp/www && echo "hello from $HOSTNAME" > /tmp/www/index.html && '
        "exec python -m http.server 8080 --directory /tmp/www",
        ports=[{"name": "http", "containerPort": 8080}],
        readinessProbe={"tcpSocket": {"port": 8080}, "periodSeconds": 1},
    )
    server["metadata"]["labels"] = {"app": "web"}
    create(cluster, ns, server)
    service = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": "web"},
        "spec": {"selector": {"app": "web"}, "ports": [{"port": 80, "targetPort": "http"}]},
    }
    create(cluster, ns, service)
    cluster_ip = cluster.request("GET", f"/api/v1/namespaces/{ns}/services/web")["spec"]["clusterIP"]
    wait_until(
        lambda: conditions(get_pod(cluster, ns, "web")).get("Ready") == "True",
        timeout=POD_TIMEOUT_S,
        what="the web server Ready",
    )

    # kube-proxy programs the new endpoint a moment after the pod is Ready: retry as clients do.
    curl = "curl -sS --max-time 10 --retry 10 --retry-delay 1 --retry-all-errors"
    client = pod(
        "client",
        f"{curl} http://{cluster_ip}/ && {curl} http://web.{ns}.svc.cluster.local/ && {curl} http://web/ && "
        "cat /etc/resolv.conf && "
        "if getent hosts example.com; then echo resolved-outside; else echo outside-not-resolved; fi",
    )
    create(cluster, ns, client)
    done = finished(cluster, ns, "client")
    logs = cluster.kubectl("logs", "-n", ns, "client")
    assert done["status"]["phase"] == "Succeeded", logs
    assert logs.count("hello from web\n") == 3, logs
    # Cluster DNS only, and it answers the cluster zone only: the host's resolver is not reachable.
    assert f"nameserver {realnode.CLUSTER_DNS_IP}" in logs
    assert "10.255.255.53" not in logs
    assert f"search {ns}.svc.cluster.local svc.cluster.local cluster.local" in logs
    assert "outside-not-resolved" in logs
    # From this host, through the API server's service proxy (Endpoints, and the route to pod IPs).
    assert (
        cluster.kubectl("get", "--raw", f"/api/v1/namespaces/{ns}/services/web:80/proxy/")
        == "hello from web\n"
    )


def test_pod_reaches_the_api_server_through_the_kubernetes_service(cluster, real_node_namespace):
    ns = real_node_namespace
    sa = "/var/run/secrets/kubernetes.io/serviceaccount"
    review = '{"apiVersion":"authentication.k8s.io/v1","kind":"SelfSubjectReview"}'
    script = (
        'echo "$KUBERNETES_SERVICE_HOST:$KUBERNETES_SERVICE_PORT"; '
        f'curl -sS --max-time 10 --cacert {sa}/ca.crt -H "Authorization: Bearer $(cat {sa}/token)" '
        f"-H 'Content-Type: application/json' -d '{review}' "
        "https://kubernetes.default.svc/apis/authentication.k8s.io/v1/selfsubjectreviews"
    )
    create(cluster, ns, pod("api", script))

    done = finished(cluster, ns, "api")
    logs = cluster.kubectl("logs", "-n", ns, "api")
    assert done["status"]["phase"] == "Succeeded", logs
    first, body = logs.split("\n", 1)
    assert first == "10.96.0.1:443"
    assert json.loads(body)["status"]["userInfo"]["username"] == f"system:serviceaccount:{ns}:default"
    endpoints = cluster.request("GET", "/api/v1/namespaces/default/endpoints/kubernetes")
    assert endpoints["subsets"][0]["addresses"][0]["ip"] == cluster.real_node.api_host


def test_gpu_pod_is_allocated_devices_by_the_stand_in_device_plugin(cluster, real_node_namespace):
    ns = real_node_namespace
    script = f'printf "%s" "${realnode.GPU_IDS_ENV}" > /dev/termination-log'
    manifest = pod("gpus", script, resources={"limits": {GPU_RESOURCE: "2"}})
    create(cluster, ns, manifest)

    done = finished(cluster, ns, "gpus")
    assert done["status"]["phase"] == "Succeeded"
    devices = terminated(done)["message"].split(",")
    assert len(set(devices)) == 2
    assert all(re.fullmatch(r"standin-gpu-[0-3]", d) for d in devices), devices


def test_kubelet_refuses_a_root_image_under_run_as_non_root(cluster, real_node_namespace):
    ns = real_node_namespace
    manifest = pod("refused", "true", image=realnode.PAUSE_IMAGE)
    manifest["spec"]["containers"][0]["securityContext"] = {"runAsNonRoot": True}
    create(cluster, ns, manifest)

    def waiting() -> dict | None:
        statuses = get_pod(cluster, ns, "refused")["status"].get("containerStatuses") or []
        return (
            statuses
            and statuses[0]["state"].get("waiting", {}).get("message")
            and statuses[0]["state"]["waiting"]
        )

    state = wait_until(waiting, timeout=POD_TIMEOUT_S, interval=0.5, what="the kubelet's refusal")
    assert state["reason"] == "CreateContainerConfigError"
    assert state["message"] == "container has runAsNonRoot and image will run as root (pod: " + (
        f'"refused_{ns}({get_pod(cluster, ns, "refused")["metadata"]["uid"]})", container: main)'
    )


def test_runtime_image_runs_eagle3_torch_and_vllm(cluster, real_node_namespace):
    ns = real_node_namespace
    # The image's own entrypoint and command: `eagle3 --help`.
    help_pod = pod("eagle3-help", "")
    del help_pod["spec"]["containers"][0]["command"]
    create(cluster, ns, help_pod)
    checks = (
        'echo "$(id -u):$(id -g) $HOME $(pwd)"; '
        'python -c "import torch, eagle3_runtime; print(torch.__version__, eagle3_runtime.__file__)" && '
        "vllm serve --help > /tmp/help 2>&1 && grep -q -- --speculative-config /tmp/help && echo vllm-serve-help-ok"
    )
    create(cluster, ns, pod("python", checks, image=DEFAULT_VLLM_IMAGE))

    helped = finished(cluster, ns, "eagle3-help")
    assert helped["status"]["phase"] == "Succeeded"
    assert "usage: eagle3" in cluster.kubectl("logs", "-n", ns, "eagle3-help")

    done = finished(cluster, ns, "python", timeout=300)
    logs = cluster.kubectl("logs", "-n", ns, "python").splitlines()
    assert done["status"]["phase"] == "Succeeded", logs
    assert logs[0] == f"1000:0 {realnode.RUNTIME_HOME} /workspace"
    torch_version, runtime_file = logs[1].split()
    assert torch_version.startswith("2.")
    assert runtime_file == "/opt/eagle3/eagle3_runtime/__init__.py", "this checkout's code, from the image"
    assert logs[-1] == "vllm-serve-help-ok", "the image's vllm wrapper runs vLLM's OpenAI server"


def test_operator_image_runs_under_the_charts_security_context(cluster, real_node_namespace):
    ns = real_node_namespace
    values = yaml.safe_load((realnode.CHART / "values.yaml").read_text())
    manifest = pod(
        "operator",
        "",
        image=realnode.OPERATOR_IMAGE,
        args=["--help"],
        securityContext=values["securityContext"],  # read-only root, no capabilities
        volumeMounts=[{"name": "tmp", "mountPath": "/tmp"}],
    )
    del manifest["spec"]["containers"][0]["command"]  # the image's entrypoint: eagle3-operator
    manifest["spec"]["securityContext"] = values["podSecurityContext"]  # 65532, seccomp RuntimeDefault
    manifest["spec"]["volumes"] = [{"name": "tmp", "emptyDir": {}}]
    create(cluster, ns, manifest)

    done = finished(cluster, ns, "operator")
    logs = cluster.kubectl("logs", "-n", ns, "operator")
    assert done["status"]["phase"] == "Succeeded", logs
    assert "usage: eagle3-operator" in logs


def _leftovers(slot: int, holder: int, workdir: Path) -> list[str]:
    """What a stopped test bed must not leave: processes, the node's link and routes, cgroups, mounts."""
    left = [f"process {holder}"] if Path(f"/proc/{holder}").exists() else []
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            if str(workdir).encode() in (proc / "cmdline").read_bytes():
                left.append(f"process {proc.name}")
        except OSError:
            continue  # exited meanwhile
    link = f"{realnode.HOST_LINK_PREFIX}{slot}"
    if Path(f"/sys/class/net/{link}").exists():
        left.append(f"link {link}")
    routes = subprocess.run(["ip", "route", "show"], capture_output=True, text=True, check=True).stdout
    left += [
        r
        for r in routes.splitlines()
        if r.startswith(
            (
                f"10.245.{slot}.",
                f"10.250.{slot}.",
                f"unreachable 10.245.{slot}.",
                f"unreachable 10.250.{slot}.",
            )
        )
    ]
    left += [str(p) for p in Path("/sys/fs/cgroup").glob(f"*/{realnode.CGROUP_PREFIX}{slot}")]
    left += [line for line in Path("/proc/self/mountinfo").read_text().splitlines() if str(workdir) in line]
    return left


@pytest.mark.parametrize("stop_signal", [signal.SIGINT, signal.SIGKILL], ids=["ctrl-c", "killed"])
def test_make_cluster_prints_the_real_node_and_leaves_nothing_behind(stop_signal):
    bed = subprocess.Popen(
        [sys.executable, "-m", "tests.support.cluster", "--gpu-nodes=0", "--cpu-nodes=0", "--real-node"],
        cwd=REPO_ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    output: list[str] = []
    try:
        for line in bed.stdout:
            output.append(line)
            if "Ctrl-C stops it" in line:
                break
        text = "".join(output)
        kubeconfig = Path(re.search(r"^kubeconfig: (\S+)", text, re.M).group(1))
        holder = int(re.search(r"nsenter --target=(\d+)", text).group(1))
        assert f"real node {realnode.NODE_NAME}" in text and realnode.STORAGE_CLASS in text, text
        nodes = subprocess.run(
            [str(find_bin_dir() / "kubectl"), f"--kubeconfig={kubeconfig}", "get", "nodes", "-o", "name"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.split()
        assert nodes == [f"node/{realnode.NODE_NAME}"]
        slot = int(re.search(r"InternalIP 10\.250\.(\d+)\.2", text).group(1))
        assert Path(f"/proc/{holder}/task/{holder}/children").read_text(), "the node's processes run"

        if stop_signal == signal.SIGKILL:
            os.kill(bed.pid, signal.SIGKILL)  # a crash: nothing in the test bed runs its stop
            bed.wait(timeout=30)
        else:
            bed.send_signal(stop_signal)
            assert bed.wait(timeout=60) == 0
    finally:
        if bed.poll() is None:
            bed.kill()
            bed.wait()
    # The holder's death takes the node's processes, mounts and link; the janitor takes the cgroups.
    workdir = kubeconfig.parent
    deadline = time.monotonic() + 30
    while (left := _leftovers(slot, holder, workdir)) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert left == []
    if stop_signal == signal.SIGINT:
        assert not workdir.exists()
    else:
        shutil.rmtree(workdir)  # what a crash leaves for the user: the logs
