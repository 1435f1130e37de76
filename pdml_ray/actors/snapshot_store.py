"""Where the scheduler actor's restart snapshot lives: Ray's GCS internal KV, in chunks committed by a manifest.

The snapshot outlives the actor's process and its node (Ray may restart the actor elsewhere). One KV value
is bounded by Ray's gRPC message size and held in the GCS's memory, so a snapshot is written in chunks of
``SNAPSHOT_CHUNK_BYTES`` and committed by a JSON manifest written last: a reader sees the previous snapshot
or this one, never half of one. The bytes are ``pdml_ray.state_format``'s (never a pickle); the manifest is
read as JSON and checked field by field.
"""

from __future__ import annotations

import json
import zlib
from urllib.parse import quote

from pdml_ray.errors import StateError

SNAPSHOT_CHUNK_BYTES = 8 * 1024 * 1024
"""Bytes per GCS KV value of a snapshot (well under Ray's 512 MiB gRPC message limit)."""
SNAPSHOT_MAX_BYTES = 256 * 1024 * 1024
"""A larger snapshot is not written (with a warning): it would sit in the GCS's memory."""
_KV_NAMESPACE = "pdml"
_MANIFEST_FORMAT = "pdml-ray-snapshot-manifest"
_MANIFEST_VERSION = 1


class SnapshotStore:
    """The scheduler's snapshot in Ray's GCS internal KV: chunks of a generation, then a manifest
    naming it (JSON, written last: a reader sees the previous snapshot or this one, never half of one)."""

    def __init__(self, name: str, namespace: str) -> None:
        self.prefix = f"scheduler-snapshot/{quote(namespace, safe='')}/{quote(name, safe='')}/"

    def save(self, blob: bytes, generation: int) -> None:
        from ray.experimental import internal_kv as kv

        chunks = [blob[i:i + SNAPSHOT_CHUNK_BYTES] for i in range(0, len(blob), SNAPSHOT_CHUNK_BYTES)] or [b""]
        for i, chunk in enumerate(chunks):
            kv._internal_kv_put(f"{self.prefix}{generation}/{i}", chunk, overwrite=True, namespace=_KV_NAMESPACE)
        manifest = {"format": _MANIFEST_FORMAT, "version": _MANIFEST_VERSION, "generation": generation,
                    "chunks": len(chunks), "bytes": len(blob), "crc32": zlib.crc32(blob)}
        kv._internal_kv_put(f"{self.prefix}manifest", json.dumps(manifest).encode(), overwrite=True,
                            namespace=_KV_NAMESPACE)
        kv._internal_kv_del(f"{self.prefix}{generation - 1}/", del_by_prefix=True, namespace=_KV_NAMESPACE)

    def load(self) -> tuple[bytes, int] | None:
        """The newest committed snapshot's bytes and its generation, or None when there is none;
        StateError when the manifest is not one ``save`` wrote or its chunks are missing or corrupt."""
        from ray.experimental import internal_kv as kv

        raw = kv._internal_kv_get(f"{self.prefix}manifest", namespace=_KV_NAMESPACE)
        if raw is None:
            return None
        manifest = _manifest(raw, f"{self.prefix}manifest")
        parts = [kv._internal_kv_get(f"{self.prefix}{manifest['generation']}/{i}", namespace=_KV_NAMESPACE)
                 for i in range(manifest["chunks"])]
        blob = b"".join(p for p in parts if p is not None)
        if None in parts or len(blob) != manifest["bytes"] or zlib.crc32(blob) != manifest["crc32"]:
            crc = "matches" if zlib.crc32(blob) == manifest["crc32"] else "does not match"
            raise StateError(f"the scheduler snapshot {self.prefix} in Ray's GCS KV is incomplete or corrupt "
                             f"({len(blob)} of {manifest['bytes']} bytes, the CRC {crc}): the restarted scheduler "
                             "starts empty")
        return blob, manifest["generation"]

    def clear(self) -> None:
        from ray.experimental import internal_kv as kv

        kv._internal_kv_del(self.prefix, del_by_prefix=True, namespace=_KV_NAMESPACE)


def _manifest(raw: bytes, key: str) -> dict[str, int]:
    """The snapshot manifest ``SnapshotStore.save`` wrote (JSON), its fields checked; StateError if not."""
    try:
        manifest = json.loads(raw)
    except (ValueError, RecursionError) as e:  # not UTF-8 or not JSON (a pickle, say): never unpickled
        raise StateError(f"the scheduler snapshot manifest {key} in Ray's GCS KV is not JSON ({type(e).__name__}); "
                         "it was not written by this pdml-ray: the restarted scheduler starts empty") from None
    fields = ("generation", "chunks", "bytes", "crc32")
    if not (isinstance(manifest, dict) and manifest.get("format") == _MANIFEST_FORMAT
            and manifest.get("version") == _MANIFEST_VERSION
            and all(type(manifest.get(k)) is int and manifest[k] >= 0 for k in fields)):  # noqa: E721 - not bools
        raise StateError(f"the scheduler snapshot manifest {key} in Ray's GCS KV is not a {_MANIFEST_FORMAT} version "
                         f"{_MANIFEST_VERSION} with integer {', '.join(fields)}: the restarted scheduler starts empty")
    return {k: manifest[k] for k in fields}


def kv_ready() -> bool:
    """Whether this process is connected to a Ray cluster's GCS (inside an actor it is)."""
    from ray.experimental import internal_kv as kv

    return bool(kv._internal_kv_initialized())
