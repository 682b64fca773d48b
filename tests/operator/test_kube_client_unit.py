"""The operator's API client keeps one connection per thread that calls the API server at once."""

from eagle3_operator.kube import load_api_client
from kubernetes import client
from kubernetes.config import kube_config

KUBECONFIG = """\
apiVersion: v1
kind: Config
clusters:
- name: c
  cluster: {server: "https://127.0.0.1:6443", insecure-skip-tls-verify: true}
users:
- name: u
  user: {token: unused}
contexts:
- name: x
  context: {cluster: c, user: u}
current-context: x
"""


def test_the_connection_pool_is_sized_for_the_callers_not_the_hosts_cpus(tmp_path, monkeypatch):
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(KUBECONFIG)
    # The client reads KUBECONFIG once, at import: its default location, as the variable would set it.
    monkeypatch.setattr(kube_config, "KUBE_CONFIG_DEFAULT_LOCATION", str(kubeconfig))
    # load_kube_config sets the process-wide default configuration: restored after the test.
    monkeypatch.setattr(client.Configuration, "_default", None)

    api = load_api_client(connections=17)

    assert api.configuration.host == "https://127.0.0.1:6443"
    # The pool urllib3 keeps: requests beyond it would open a TLS connection each and drop it.
    assert api.rest_client.pool_manager.connection_pool_kw["maxsize"] == 17
