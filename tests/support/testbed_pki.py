"""Certificates and kubeconfigs for the local control plane (tests/support/cluster.py).

One throw-away CA signs the API server's serving certificate and one client certificate per
identity (admin, controller-manager, scheduler, kwok; with the real node also its kubelet's
serving and client certificates, kube-proxy's, and the API server's kubelet client); a second one, the front-proxy CA, signs the
certificate the API server presents to aggregated API servers (as kubeadm sets it up). ECDSA P-256 keys: generating them takes
milliseconds, where RSA-2048 takes a noticeable part of a test-bed start.
"""

from __future__ import annotations

import base64
import datetime as dt
import ipaddress
from dataclasses import dataclass
from pathlib import Path

import yaml
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

# The in-cluster names and first service IP of the API server (--service-cluster-ip-range
# 10.96.0.0/16), and loopback; with the real node also the address it serves pods at.
API_SERVER_HOSTS = (
    "localhost",
    "kubernetes",
    "kubernetes.default",
    "kubernetes.default.svc",
    "kubernetes.default.svc.cluster.local",
    "127.0.0.1",
    "10.96.0.1",
)
VALIDITY = dt.timedelta(days=2)


@dataclass(frozen=True)
class KeyPair:
    cert: Path
    key: Path


def _new_key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _write_key(path: Path, key: ec.EllipticCurvePrivateKey) -> None:
    path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    path.chmod(0o600)


def _name(common_name: str, organization: str | None = None) -> x509.Name:
    attributes = [x509.NameAttribute(NameOID.COMMON_NAME, common_name)]
    if organization:
        attributes.append(x509.NameAttribute(NameOID.ORGANIZATION_NAME, organization))
    return x509.Name(attributes)


def _general_name(host: str) -> x509.GeneralName:
    try:
        return x509.IPAddress(ipaddress.ip_address(host))
    except ValueError:
        return x509.DNSName(host)


class CertificateAuthority:
    """A self-signed CA written to <dir>/<stem>.crt and <dir>/<stem>.key."""

    def __init__(self, directory: Path, stem: str = "ca", common_name: str = "eagle3-testbed-ca") -> None:
        self.directory = directory
        self._key = _new_key()
        now = dt.datetime.now(dt.UTC)
        subject = _name(common_name)
        self._cert = (
            x509.CertificateBuilder()
            .subject_name(subject)
            .issuer_name(subject)
            .public_key(self._key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(minutes=5))
            .not_valid_after(now + VALIDITY)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .add_extension(
                x509.KeyUsage(
                    digital_signature=True,
                    key_cert_sign=True,
                    crl_sign=True,
                    content_commitment=False,
                    key_encipherment=False,
                    data_encipherment=False,
                    key_agreement=False,
                    encipher_only=False,
                    decipher_only=False,
                ),
                critical=True,
            )
            .sign(self._key, hashes.SHA256())
        )
        self.pair = KeyPair(directory / f"{stem}.crt", directory / f"{stem}.key")
        self.pair.cert.write_bytes(self._cert.public_bytes(serialization.Encoding.PEM))
        _write_key(self.pair.key, self._key)

    def issue(
        self,
        stem: str,
        common_name: str,
        *,
        organization: str | None = None,
        server_hosts: tuple[str, ...] = (),
    ) -> KeyPair:
        """Sign a client certificate, or with server_hosts (IPs and DNS names) a serving certificate."""
        key = _new_key()
        now = dt.datetime.now(dt.UTC)
        usage = ExtendedKeyUsageOID.SERVER_AUTH if server_hosts else ExtendedKeyUsageOID.CLIENT_AUTH
        builder = (
            x509.CertificateBuilder()
            .subject_name(_name(common_name, organization))
            .issuer_name(self._cert.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(minutes=5))
            .not_valid_after(now + VALIDITY)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
        )
        if server_hosts:
            names = [_general_name(host) for host in server_hosts]
            builder = builder.add_extension(x509.SubjectAlternativeName(names), critical=False)
        cert = builder.sign(self._key, hashes.SHA256())
        pair = KeyPair(self.directory / f"{stem}.crt", self.directory / f"{stem}.key")
        pair.cert.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        _write_key(pair.key, key)
        return pair


def write_service_account_keys(directory: Path) -> KeyPair:
    """The key pair the API server signs service-account tokens with (ES256)."""
    key = _new_key()
    pair = KeyPair(directory / "sa.pub", directory / "sa.key")
    pair.cert.write_bytes(
        key.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )
    )
    _write_key(pair.key, key)
    return pair


def write_kubeconfig(path: Path, *, server: str, ca: Path, client: KeyPair, user: str) -> Path:
    """A self-contained kubeconfig (certificates embedded) for one identity."""

    def b64(file: Path) -> str:
        return base64.b64encode(file.read_bytes()).decode()

    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {"name": "eagle3-testbed", "cluster": {"server": server, "certificate-authority-data": b64(ca)}}
        ],
        "users": [
            {
                "name": user,
                "user": {"client-certificate-data": b64(client.cert), "client-key-data": b64(client.key)},
            }
        ],
        "contexts": [{"name": "eagle3-testbed", "context": {"cluster": "eagle3-testbed", "user": user}}],
        "current-context": "eagle3-testbed",
    }
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    path.chmod(0o600)
    return path


def write_kubeconfigs(
    directory: Path, *, server: str, ca: Path, clients: dict[str, KeyPair]
) -> dict[str, Path]:
    """<directory>/<name>.kubeconfig for each named client."""
    return {
        name: write_kubeconfig(directory / f"{name}.kubeconfig", server=server, ca=ca, client=pair, user=name)
        for name, pair in clients.items()
    }
