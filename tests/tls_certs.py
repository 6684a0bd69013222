"""Throwaway TLS material for tests: a CA, and a server certificate for 127.0.0.1 signed by it.

Made with `cryptography` at test time, in PEM: the CA certificate is the clients' --ssl-cafile,
the server certificate and its unencrypted PKCS#8 key are the broker's --tls-certfile and
--tls-keyfile. Nothing here is fit for anything but a test on loopback.
"""

from __future__ import annotations

import datetime
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID


@dataclass(frozen=True)
class TlsFiles:
    """Paths of the PEM files one test needs."""

    ca_cert: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def _signed(
    subject: x509.Name,
    key: ec.EllipticCurvePrivateKey,
    issuer: x509.Name,
    issuer_key: ec.EllipticCurvePrivateKey,
    *,
    ca: bool,
    san: x509.SubjectAlternativeName | None = None,
) -> x509.Certificate:
    now = datetime.datetime.now(datetime.UTC)
    builder = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=2))
        .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
    )
    if san is not None:
        builder = builder.add_extension(san, critical=False)
    return builder.sign(issuer_key, hashes.SHA256())


def make_tls_files(directory: Path) -> TlsFiles:
    """Write ca.pem, server.pem/server-key.pem (for 127.0.0.1 and localhost) and a client pair."""
    directory.mkdir(parents=True, exist_ok=True)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = _name("sessionfold test CA")
    ca = _signed(ca_name, ca_key, ca_name, ca_key, ca=True)
    san = x509.SubjectAlternativeName(
        [x509.IPAddress(ipaddress.ip_address("127.0.0.1")), x509.DNSName("localhost")]
    )
    server_key = ec.generate_private_key(ec.SECP256R1())
    server = _signed(_name("127.0.0.1"), server_key, ca_name, ca_key, ca=False, san=san)
    client_key = ec.generate_private_key(ec.SECP256R1())
    client = _signed(_name("sessionfold-client"), client_key, ca_name, ca_key, ca=False)
    files = TlsFiles(
        ca_cert=directory / "ca.pem",
        server_cert=directory / "server.pem",
        server_key=directory / "server-key.pem",
        client_cert=directory / "client.pem",
        client_key=directory / "client-key.pem",
    )
    files.ca_cert.write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    files.server_cert.write_bytes(server.public_bytes(serialization.Encoding.PEM))
    files.server_key.write_bytes(_key_pem(server_key))
    files.client_cert.write_bytes(client.public_bytes(serialization.Encoding.PEM))
    files.client_key.write_bytes(_key_pem(client_key))
    return files
