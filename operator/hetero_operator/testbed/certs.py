"""Throwaway PKI for the test bed: a CA, the API server's serving certificate, an admin client
certificate and the service-account signing key, all generated with `cryptography`."""

from __future__ import annotations

import datetime as dt
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

ADMIN_USER = "heterotrain-admin"
ADMIN_GROUP = "system:masters"
_VALIDITY = dt.timedelta(days=365)


@dataclass(frozen=True)
class Pki:
    """Paths of every PEM file the control plane and its clients need."""

    ca_cert: Path
    ca_key: Path
    server_cert: Path
    server_key: Path
    admin_cert: Path
    admin_key: Path
    sa_key: Path
    sa_pub: Path


def _name(common_name: str, organization: str | None = None) -> x509.Name:
    parts = [x509.NameAttribute(NameOID.COMMON_NAME, common_name)]
    if organization:
        parts.append(x509.NameAttribute(NameOID.ORGANIZATION_NAME, organization))
    return x509.Name(parts)


def _write_key(path: Path, key: ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey) -> None:
    path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    path.chmod(0o600)


def _sign(
    subject: x509.Name,
    public_key: ec.EllipticCurvePublicKey,
    issuer: x509.Name,
    issuer_key: ec.EllipticCurvePrivateKey,
    *,
    is_ca: bool = False,
    server_names: tuple[str, ...] = (),
    server_ips: tuple[str, ...] = (),
    client: bool = False,
) -> x509.Certificate:
    now = dt.datetime.now(dt.UTC)
    builder = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer)
        .public_key(public_key)
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + _VALIDITY)
        .add_extension(x509.BasicConstraints(ca=is_ca, path_length=None), critical=True)
    )
    if is_ca:
        builder = builder.add_extension(
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
    else:
        usages = [ExtendedKeyUsageOID.CLIENT_AUTH] if client else [ExtendedKeyUsageOID.SERVER_AUTH]
        builder = builder.add_extension(x509.ExtendedKeyUsage(usages), critical=False)
    if server_names or server_ips:
        alt: list[x509.GeneralName] = [x509.DNSName(n) for n in server_names]
        alt += [x509.IPAddress(ipaddress.ip_address(ip)) for ip in server_ips]
        builder = builder.add_extension(x509.SubjectAlternativeName(alt), critical=False)
    return builder.sign(issuer_key, hashes.SHA256())


def _write_cert(path: Path, cert: x509.Certificate) -> None:
    path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))


def generate(directory: Path) -> Pki:
    """Create a fresh PKI in `directory` (overwriting any previous one) and return its paths."""
    directory.mkdir(parents=True, exist_ok=True)
    pki = Pki(
        ca_cert=directory / "ca.crt",
        ca_key=directory / "ca.key",
        server_cert=directory / "apiserver.crt",
        server_key=directory / "apiserver.key",
        admin_cert=directory / "admin.crt",
        admin_key=directory / "admin.key",
        sa_key=directory / "sa.key",
        sa_pub=directory / "sa.pub",
    )
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = _name("heterotrain-testbed-ca")
    _write_key(pki.ca_key, ca_key)
    _write_cert(pki.ca_cert, _sign(ca_name, ca_key.public_key(), ca_name, ca_key, is_ca=True))

    server_key = ec.generate_private_key(ec.SECP256R1())
    _write_key(pki.server_key, server_key)
    server = _sign(
        _name("kube-apiserver"),
        server_key.public_key(),
        ca_name,
        ca_key,
        server_names=("localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc"),
        server_ips=("127.0.0.1",),
    )
    _write_cert(pki.server_cert, server)

    admin_key = ec.generate_private_key(ec.SECP256R1())
    _write_key(pki.admin_key, admin_key)
    admin = _sign(_name(ADMIN_USER, ADMIN_GROUP), admin_key.public_key(), ca_name, ca_key, client=True)
    _write_cert(pki.admin_cert, admin)

    # Service-account tokens are signed with RSA: every client library verifies RS256.
    sa_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    _write_key(pki.sa_key, sa_key)
    pki.sa_pub.write_bytes(
        sa_key.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )
    )
    return pki


def issue_serving_cert(
    pki: Pki, cert_path: Path, key_path: Path, common_name: str, server_ips: tuple[str, ...] = ("127.0.0.1",)
) -> None:
    """A serving certificate signed by the test bed's CA, for a server the API server calls on
    loopback (an admission webhook): its address is an IP SAN, as no Service name routes here."""
    ca_key = serialization.load_pem_private_key(pki.ca_key.read_bytes(), password=None)
    if not isinstance(ca_key, ec.EllipticCurvePrivateKey):
        raise TypeError(f"{pki.ca_key} is not the test bed's EC CA key")
    ca_name = x509.load_pem_x509_certificate(pki.ca_cert.read_bytes()).subject
    key = ec.generate_private_key(ec.SECP256R1())
    cert_path.parent.mkdir(parents=True, exist_ok=True)
    _write_key(key_path, key)
    cert = _sign(
        _name(common_name),
        key.public_key(),
        ca_name,
        ca_key,
        server_names=("localhost",),
        server_ips=server_ips,
    )
    _write_cert(cert_path, cert)
