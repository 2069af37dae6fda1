"""A worker's key file and the key proof of its registration (docs/protocol.md section 13).

The key file (``corral keys add-worker ID --out FILE``) is JSON::

    {"format": "corral-worker-key/1", "worker_id": ..., "public_key": ..., "secret_key": ...,
     "server_key": ..., "token": ...}

The proof over a challenge's nonce::

    shared = X25519(worker secret key, daemon public key)
    proof  = base64url_nopad(HMAC-SHA256(shared, "corral-worker-proof/1\\n" + worker_id + "\\n" + nonce))

Error messages never include a key file's content: it holds a secret.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import os
import re
from dataclasses import dataclass, field
from typing import Mapping, Union

from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey

from .errors import KeyFileError
from .protocol import WORKER_ID_RE

WORKER_KEY_FORMAT = "corral-worker-key/1"
PROOF_LABEL = "corral-worker-proof/1"
Z85_KEY_RE = re.compile(r"[0-9a-zA-Z.\-:+=^!/*?&<>()\[\]{}@%$#]{40}")
MAX_KEY_FILE_BYTES = 64 * 1024


@dataclass(frozen=True)
class WorkerKey:
    """A parsed key file. ``repr`` hides the secrets."""

    worker_id: str
    public_key: str
    secret_key: str = field(repr=False)
    server_key: str
    token: str = field(repr=False)

    def shared_secret(self) -> bytes:
        """X25519(worker secret, daemon public): what keys the proof."""
        return curve_shared_secret(self.secret_key, self.server_key)

    def proof(self, nonce: str) -> str:
        """The key proof for this worker's id over the daemon's ``nonce``."""
        return registration_proof(self.shared_secret(), self.worker_id, nonce)


_Z85_CHARS = "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ.-:+=^!/*?&<>()[]{}@%$#"
_Z85_VALUE = {c: i for i, c in enumerate(_Z85_CHARS)}


def z85_decode(text: str) -> bytes:
    """ZeroMQ RFC 32: 5 characters to 4 bytes, big-endian."""
    if len(text) % 5:
        raise ValueError("Z85 text must be a multiple of 5 characters")
    out = bytearray()
    for i in range(0, len(text), 5):
        n = 0
        for c in text[i : i + 5]:
            v = _Z85_VALUE.get(c)
            if v is None:
                raise ValueError(f"{c!r} is not a Z85 character")
            n = n * 85 + v
        if n > 0xFFFFFFFF:
            raise ValueError("Z85 group out of range")
        out += n.to_bytes(4, "big")
    return bytes(out)


def _raw(key: str, what: str) -> bytes:
    if not Z85_KEY_RE.fullmatch(key):
        raise ValueError(f"{what} is not a 40-character Z85 CURVE key")
    return z85_decode(key)


def curve_shared_secret(secret_key_z85: str, public_key_z85: str) -> bytes:
    """X25519 of two Z85 CURVE keys: the 32 bytes both ends of a pair can compute."""
    private = X25519PrivateKey.from_private_bytes(_raw(secret_key_z85, "the secret key"))
    public = X25519PublicKey.from_public_bytes(_raw(public_key_z85, "the public key"))
    return private.exchange(public)


def registration_proof(shared: bytes, worker_id: str, nonce: str) -> str:
    mac = hmac.new(shared, f"{PROOF_LABEL}\n{worker_id}\n{nonce}".encode("utf-8"), hashlib.sha256)
    return base64.urlsafe_b64encode(mac.digest()).rstrip(b"=").decode("ascii")


KeySource = Union[str, Mapping[str, object]]


def parse_worker_key(content: KeySource, where: str = "the worker key given") -> WorkerKey:
    """A key file's content (its JSON text or the parsed object) as a :class:`WorkerKey`;
    raises :class:`KeyFileError` saying which field is wrong."""
    raw: object = content
    if isinstance(content, str):
        try:
            raw = json.loads(content)
        except ValueError:
            raise KeyFileError(f"{where} is not valid JSON") from None
    if not isinstance(raw, Mapping):
        raise KeyFileError(f"{where} is not a JSON object")
    obj: Mapping[str, object] = raw
    if obj.get("format") != WORKER_KEY_FORMAT:
        raise KeyFileError(f'{where} is not a worker key file (format is not "{WORKER_KEY_FORMAT}")')

    def text(name: str) -> str:
        v = obj.get(name)
        if not isinstance(v, str):
            raise KeyFileError(f"{where} is invalid: {name}: expected a string")
        return v

    worker_id = text("worker_id")
    if not WORKER_ID_RE.fullmatch(worker_id):
        raise KeyFileError(f"{where} is invalid: worker_id: expected 1..64 characters of [A-Za-z0-9._:-]")
    for name in ("public_key", "secret_key", "server_key"):
        if not Z85_KEY_RE.fullmatch(text(name)):
            raise KeyFileError(f"{where} is invalid: {name}: expected a 40-character Z85 CURVE key")
    token = text("token")
    if not 16 <= len(token) <= 256:
        raise KeyFileError(f"{where} is invalid: token: expected 16..256 characters")
    key = WorkerKey(
        worker_id=worker_id,
        public_key=text("public_key"),
        secret_key=text("secret_key"),
        server_key=text("server_key"),
        token=token,
    )
    try:
        key.shared_secret()
    except ValueError as e:
        # a low-order public key, say: no proof can be made with it
        raise KeyFileError(f"{where} is invalid: no X25519 secret for its keys ({e})") from None
    return key


def read_worker_key(path: str | os.PathLike[str]) -> WorkerKey:
    """Read and check a key file; raises :class:`KeyFileError` (missing, unreadable, invalid)."""
    p = os.fspath(path)
    try:
        with open(p, "rb") as fh:
            data = fh.read(MAX_KEY_FILE_BYTES + 1)
    except FileNotFoundError:
        raise KeyFileError(f"worker key file {p} does not exist (make one with: corral keys add-worker <id> --out {p})") from None
    except OSError as e:
        raise KeyFileError(f"cannot read worker key file {p}: {e.strerror or e}") from None
    if len(data) > MAX_KEY_FILE_BYTES:
        raise KeyFileError(f"worker key file {p} is larger than {MAX_KEY_FILE_BYTES} bytes: not a key file")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise KeyFileError(f"worker key file {p} is not UTF-8 text") from None
    return parse_worker_key(text, f"worker key file {p}")
