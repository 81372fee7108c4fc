"""Key material for a deployment: a local CA and a SuperLink certificate for TLS, and one EC key pair
per SuperNode for SuperNode authentication. Made with ``cryptography`` (a Flower dependency)."""

from __future__ import annotations

import datetime as dt
import ipaddress
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from fedsim.deploy.topology import TlsFiles
from fedsim.files import make_dirs, write_file

VALID_DAYS = 365
CA_USAGE = x509.KeyUsage(
    digital_signature=True, key_cert_sign=True, crl_sign=True, content_commitment=False, key_encipherment=False,
    data_encipherment=False, key_agreement=False, encipher_only=False, decipher_only=False,
)  # fmt: skip


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


SECRET = 0o600  # a private key's mode: readable by the owner only from the start (not chmod after writing)


def _write_key(path: Path, key: ec.EllipticCurvePrivateKey) -> None:
    pkcs8 = serialization.PrivateFormat.PKCS8
    write_file(path, key.private_bytes(serialization.Encoding.PEM, pkcs8, serialization.NoEncryption()), mode=SECRET)


def _san(host: str) -> x509.GeneralName:
    try:
        return x509.IPAddress(ipaddress.ip_address(host))
    except ValueError:
        return x509.DNSName(host)


def make_tls(directory: Path, hosts: list[str]) -> TlsFiles:
    """A fresh CA and a SuperLink certificate valid for every name in ``hosts`` (its SANs), in ``directory``
    (made in the directory of fedsim's above it, never through a link: :mod:`fedsim.files`)."""
    make_dirs(directory, directory.parent)
    now = dt.datetime.now(dt.UTC)
    ca_key = ec.generate_private_key(ec.SECP384R1())
    ca = (
        x509.CertificateBuilder()
        .subject_name(_name("fedsim local CA"))
        .issuer_name(_name("fedsim local CA"))
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=VALID_DAYS))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(CA_USAGE, critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    key = ec.generate_private_key(ec.SECP384R1())
    cert = (
        x509.CertificateBuilder()
        .subject_name(_name("fedsim superlink"))
        .issuer_name(ca.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=VALID_DAYS))
        .add_extension(x509.SubjectAlternativeName([_san(h) for h in dict.fromkeys(hosts)]), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([x509.ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    files = TlsFiles(ca=str(directory / "ca.pem"), cert=str(directory / "superlink.pem"),
                     key=str(directory / "superlink.key"))  # fmt: skip
    write_file(Path(files.ca), ca.public_bytes(serialization.Encoding.PEM))
    write_file(Path(files.cert), cert.public_bytes(serialization.Encoding.PEM))
    _write_key(Path(files.key), key)
    return files


def make_node_keys(directory: Path, num_nodes: int) -> list[tuple[Path, Path]]:
    """One P-384 key pair per SuperNode: (private key, public key) paths, in ``directory`` (made as
    :func:`make_tls` makes its own)."""
    make_dirs(directory, directory.parent)
    pairs = []
    for pid in range(num_nodes):
        key = ec.generate_private_key(ec.SECP384R1())
        private, public = directory / f"supernode-{pid}.key", directory / f"supernode-{pid}.pub"
        # OpenSSH formats, as `ssh-keygen -t ecdsa -b 384` writes them: what Flower reads
        openssh = serialization.PrivateFormat.OpenSSH
        pem = key.private_bytes(serialization.Encoding.PEM, openssh, serialization.NoEncryption())
        write_file(private, pem, mode=SECRET)
        openssh_public = serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH
        write_file(public, key.public_key().public_bytes(*openssh_public))
        pairs.append((private, public))
    return pairs
