"""Builds OCI image archives for the test bed's real node, which has no registry to pull from.

An image here is one uncompressed layer (a tar of directories, files and symlinks) plus its
config, manifest and index, written as an OCI image layout in a tar file that containerd imports
(`ctr -n k8s.io images import`) under every name the index lists. The bytes depend only on the
entries and the config (sorted entries, fixed timestamps and owners), so an archive is built once
per content and cached under its digest.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import tarfile
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

LAYER_MEDIA_TYPE = "application/vnd.oci.image.layer.v1.tar"
CONFIG_MEDIA_TYPE = "application/vnd.oci.image.config.v1+json"
MANIFEST_MEDIA_TYPE = "application/vnd.oci.image.manifest.v1+json"
# containerd reads the image name of an imported manifest from this index annotation.
NAME_ANNOTATION = "io.containerd.image.name"
BUILDER_VERSION = "1"  # part of every cache key: bump when the archive format changes


@dataclass(frozen=True)
class Entry:
    """One path in the layer: a directory, a file (data or a host file to copy) or a symlink."""

    path: str
    kind: str
    mode: int = 0o755
    uid: int = 0
    gid: int = 0
    data: bytes | None = None
    source: Path | None = None
    target: str = ""

    def digest_input(self) -> bytes:
        content = self.data if self.data is not None else b""
        if self.source is not None:
            content = self.source.read_bytes()
        header = f"{self.kind}\0{self.path}\0{self.mode:o}\0{self.uid}\0{self.gid}\0{self.target}\0"
        return header.encode() + hashlib.sha256(content).digest()


def directory(path: str, mode: int = 0o755, uid: int = 0, gid: int = 0) -> Entry:
    return Entry(path.strip("/"), "dir", mode, uid, gid)


def file(path: str, content: bytes | Path, mode: int = 0o644, uid: int = 0, gid: int = 0) -> Entry:
    if isinstance(content, Path):
        return Entry(path.strip("/"), "file", mode, uid, gid, source=content)
    return Entry(path.strip("/"), "file", mode, uid, gid, data=content)


def symlink(path: str, target: str) -> Entry:
    return Entry(path.strip("/"), "symlink", 0o777, target=target)


def tree(destination: str, source: Path, *, skip: Iterable[str] = ("__pycache__",)) -> list[Entry]:
    """A host directory's files (read-only for everyone), without the names in `skip`."""
    skipped = set(skip)
    entries = [directory(destination)]
    for root, dirs, files in os.walk(source):
        dirs[:] = sorted(d for d in dirs if d not in skipped)
        relative = Path(root).relative_to(source)
        for name in dirs:
            entries.append(directory(f"{destination}/{relative / name}"))
        for name in sorted(files):
            if name not in skipped and not name.endswith(".pyc"):
                entries.append(file(f"{destination}/{relative / name}", Path(root) / name))
    return entries


@dataclass(frozen=True)
class ImageConfig:
    """The runtime part of an image config (what `docker inspect` shows under Config)."""

    entrypoint: list[str]
    cmd: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    user: str = ""
    workdir: str = ""

    def to_json(self) -> dict:
        config: dict = {"Entrypoint": self.entrypoint, "Env": [f"{k}={v}" for k, v in self.env.items()]}
        if self.cmd:
            config["Cmd"] = self.cmd
        if self.user:
            config["User"] = self.user
        if self.workdir:
            config["WorkingDir"] = self.workdir
        return config


def canonical_name(reference: str) -> str:
    """The fully qualified name containerd's CRI looks an image up by (docker.io/library/... )."""
    first, _, rest = reference.partition("/")
    if not rest:
        return f"docker.io/library/{reference}"
    if "." in first or ":" in first or first == "localhost":
        return reference
    return f"docker.io/{reference}"


def _layer(entries: list[Entry]) -> bytes:
    buffer = io.BytesIO()
    # Parents before children, then by name: the same entries always give the same bytes.
    ordered = sorted(entries, key=lambda e: (e.path.count("/"), e.path))
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for entry in ordered:
            info = tarfile.TarInfo(entry.path)
            info.mode, info.uid, info.gid, info.mtime = entry.mode, entry.uid, entry.gid, 0
            if entry.kind == "dir":
                info.type = tarfile.DIRTYPE
                tar.addfile(info)
            elif entry.kind == "symlink":
                info.type, info.linkname = tarfile.SYMTYPE, entry.target
                tar.addfile(info)
            else:
                data = entry.data if entry.source is None else entry.source.read_bytes()
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


def _blob(content: bytes, media_type: str) -> tuple[dict, bytes]:
    digest = "sha256:" + hashlib.sha256(content).hexdigest()
    return {"mediaType": media_type, "digest": digest, "size": len(content)}, content


def build(cache_dir: Path, names: list[str], entries: list[Entry], config: ImageConfig) -> Path:
    """The archive of an image with these names, entries and config; built unless cached."""
    key = hashlib.sha256(BUILDER_VERSION.encode())
    key.update(json.dumps([sorted(canonical_name(n) for n in names), config.to_json()]).encode())
    for entry in sorted(entries, key=lambda e: e.path):
        key.update(entry.digest_input())
    archive = cache_dir / f"{key.hexdigest()[:16]}.tar"
    if archive.exists():
        return archive

    layer = _layer(entries)
    layer_descriptor, _ = _blob(layer, LAYER_MEDIA_TYPE)
    image_config = {
        "architecture": "amd64",
        "os": "linux",
        "config": config.to_json(),
        "rootfs": {"type": "layers", "diff_ids": [layer_descriptor["digest"]]},
    }
    config_descriptor, config_bytes = _blob(
        json.dumps(image_config, sort_keys=True).encode(), CONFIG_MEDIA_TYPE
    )
    manifest = {
        "schemaVersion": 2,
        "mediaType": MANIFEST_MEDIA_TYPE,
        "config": config_descriptor,
        "layers": [layer_descriptor],
    }
    manifest_descriptor, manifest_bytes = _blob(
        json.dumps(manifest, sort_keys=True).encode(), MANIFEST_MEDIA_TYPE
    )
    index = {
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.index.v1+json",
        "manifests": [
            manifest_descriptor
            | {
                "platform": {"architecture": "amd64", "os": "linux"},
                "annotations": {NAME_ANNOTATION: canonical_name(name)},
            }
            for name in names
        ],
    }
    files = {
        "oci-layout": json.dumps({"imageLayoutVersion": "1.0.0"}).encode(),
        "index.json": json.dumps(index, sort_keys=True).encode(),
    }
    for descriptor, content in (
        (layer_descriptor, layer),
        (config_descriptor, config_bytes),
        (manifest_descriptor, manifest_bytes),
    ):
        files[f"blobs/sha256/{descriptor['digest'].removeprefix('sha256:')}"] = content

    cache_dir.mkdir(parents=True, exist_ok=True)
    partial = archive.with_suffix(f".{os.getpid()}.partial")
    with tarfile.open(partial, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for directory_name in ("blobs", "blobs/sha256"):
            info = tarfile.TarInfo(directory_name)
            info.type, info.mode = tarfile.DIRTYPE, 0o755
            tar.addfile(info)
        for name, content in files.items():
            info = tarfile.TarInfo(name)
            info.size, info.mode = len(content), 0o644
            tar.addfile(info, io.BytesIO(content))
    partial.replace(archive)  # complete archives only: a concurrent builder writes the same bytes
    return archive
