"""Helpers for the access-control and abuse tests: a throwaway CA with server and client certificates, token files,
secured pools, a decompression bomb.

Fixture (a plugin of tests/conftest.py): ``pki`` (module), a fresh ``make_pki()`` for the test module.
"""

from __future__ import annotations

import datetime
import ipaddress
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.ipc as ipc
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from pool.auth import TlsConfig, TokenTable
from snapshot.format import CANONICAL_SCHEMA, CHANGELOG_SCHEMA, write_snapshot

TOKENS_TEXT = """\
# token            jobs              access
tok-a-rw           job-a             rw
tok-a-ro           job-a             read
tok-b-rw           job-b,job-b2      rw
tok-admin          *                 rw
tok-team           team-*            write
"""


@dataclass(frozen=True)
class Pki:
    """PEMs of a CA, a server certificate for 127.0.0.1/localhost and a client certificate, all signed by the CA."""

    ca_pem: bytes
    server_cert_pem: bytes
    server_key_pem: bytes
    client_cert_pem: bytes
    client_key_pem: bytes
    other_ca_pem: bytes

    def server_tls(self, client_ca: bool = False) -> TlsConfig:
        """The server's TlsConfig (mutual TLS when client_ca)."""
        return TlsConfig(self.server_cert_pem, self.server_key_pem, self.ca_pem if client_ca else None)

    def write(self, folder: Path) -> dict[str, Path]:
        """Write every PEM to folder; returns their paths by name."""
        folder.mkdir(parents=True, exist_ok=True)
        out = {}
        for name in ("ca_pem", "server_cert_pem", "server_key_pem", "client_cert_pem", "client_key_pem", "other_ca_pem"):
            path = folder / f"{name}.pem"
            path.write_bytes(getattr(self, name))
            out[name] = path
        return out


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())


def _ca(name: str) -> tuple[ec.EllipticCurvePrivateKey, x509.Certificate]:
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
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
        .sign(key, hashes.SHA256())
    )
    return key, cert


def _leaf(ca_key, ca_cert, name: str, server: bool) -> tuple[bytes, bytes]:
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.timezone.utc)
    builder = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)]))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(
            x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH if server else ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False
        )
    )
    if server:
        builder = builder.add_extension(
            x509.SubjectAlternativeName([x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), critical=False
        )
    cert = builder.sign(ca_key, hashes.SHA256())
    return cert.public_bytes(serialization.Encoding.PEM), _key_pem(key)


def make_pki() -> Pki:
    """A fresh CA and leaf certificates (valid one day), plus an unrelated CA for negative tests."""
    ca_key, ca_cert = _ca("clink test CA")
    server_cert, server_key = _leaf(ca_key, ca_cert, "clink-pool", server=True)
    client_cert, client_key = _leaf(ca_key, ca_cert, "clink-worker", server=False)
    _, other = _ca("some other CA")
    return Pki(
        ca_cert.public_bytes(serialization.Encoding.PEM),
        server_cert,
        server_key,
        client_cert,
        client_key,
        other.public_bytes(serialization.Encoding.PEM),
    )


@pytest.fixture(scope="module")
def pki() -> Pki:
    """A throwaway CA and certificates, one per test module."""
    return make_pki()


def token_table() -> TokenTable:
    """The tokens of TOKENS_TEXT."""
    return TokenTable.parse(TOKENS_TEXT, "tokens.txt")


def zstd_bomb(decoded_bytes: int, changelog: bool = False) -> bytes:
    """A snapshot stream (canonical, or changelog) whose one zstd-compressed batch decodes to ``decoded_bytes`` of zeros."""
    schema = CHANGELOG_SCHEMA if changelog else CANONICAL_SCHEMA
    cols = [pa.array([7], pa.uint64()), pa.array([b"\x05bomb"]), pa.array([b"\x00" * decoded_bytes])]
    if changelog:
        cols.insert(0, pa.array([1], pa.int8()))
    meta = dict(
        ipc.open_stream(write_snapshot(pa.table([c.slice(0, 0) for c in cols], schema=schema), changelog=changelog)).schema.metadata
    )
    sink = pa.BufferOutputStream()
    with ipc.new_stream(sink, schema.with_metadata(meta), options=ipc.IpcWriteOptions(compression="zstd")) as w:
        w.write_batch(pa.record_batch(cols, schema=schema))
    return sink.getvalue().to_pybytes()
