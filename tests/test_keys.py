"""A deployment's key material (fedsim/deploy/keys.py): the local CA and the SuperLink certificate it signs for
every name given, and one OpenSSH key pair per SuperNode; private keys the owner's alone, nothing written through a
link. Read back with ``cryptography``'s own loaders and checks. The files in use (the SuperLink's flags, the compose
project's copies): tests/test_compose.py; across real processes: tests/test_deploy.py."""

from __future__ import annotations

import datetime as dt
import ipaddress
import os
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from fedsim.deploy.keys import make_node_keys, make_tls
from fedsim.deploy.topology import TlsFiles
from fedsim.errors import LinkError


@pytest.fixture
def umask_022() -> Iterator[None]:
    old = os.umask(0o022)
    yield
    os.umask(old)


def cert(path: str) -> x509.Certificate:
    return x509.load_pem_x509_certificate(Path(path).read_bytes())


def common_name(name: x509.Name) -> str:
    (attribute,) = name.get_attributes_for_oid(NameOID.COMMON_NAME)
    return str(attribute.value)


def public_der(key: ec.EllipticCurvePublicKey) -> bytes:
    return key.public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)


def test_the_superlink_certificate_is_the_cas_for_every_host_given_once(tmp_path: Path) -> None:
    directory = tmp_path / "deploy" / "tls"
    before = dt.datetime.now(dt.UTC)
    files = make_tls(directory, ["127.0.0.1", "superlink", "::1", "server.example.org", "superlink", "127.0.0.1"])
    after = dt.datetime.now(dt.UTC)
    assert files == TlsFiles(*(str(directory / name) for name in ("ca.pem", "superlink.pem", "superlink.key")))
    ca, link = cert(files.ca), cert(files.cert)

    # the CA: self-signed, a CA of depth 0, which signs certificates (and CRLs) only
    assert common_name(ca.subject) == common_name(ca.issuer) == "fedsim local CA"
    ca.verify_directly_issued_by(ca)
    constraints = ca.extensions.get_extension_for_class(x509.BasicConstraints)
    assert constraints.critical and (constraints.value.ca, constraints.value.path_length) == (True, 0)
    usage = ca.extensions.get_extension_for_class(x509.KeyUsage)
    assert usage.critical and usage.value.key_cert_sign and usage.value.crl_sign and usage.value.digital_signature
    assert not (usage.value.key_encipherment or usage.value.data_encipherment or usage.value.key_agreement)

    # the SuperLink's: signed by that CA, no CA itself, for servers, every host once in the order given
    link.verify_directly_issued_by(ca)
    assert common_name(link.subject) == "fedsim superlink" and link.issuer == ca.subject
    assert link.extensions.get_extension_for_class(x509.BasicConstraints).value.ca is False
    purposes = link.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert list(purposes) == [ExtendedKeyUsageOID.SERVER_AUTH]
    san = link.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert list(san) == [
        x509.IPAddress(ipaddress.ip_address("127.0.0.1")), x509.DNSName("superlink"),
        x509.IPAddress(ipaddress.ip_address("::1")), x509.DNSName("server.example.org"),
    ]  # fmt: skip
    authority = link.extensions.get_extension_for_class(x509.AuthorityKeyIdentifier).value.key_identifier
    assert authority == ca.extensions.get_extension_for_class(x509.SubjectKeyIdentifier).value.digest

    # its private key: the certificate's, P-384, unencrypted PKCS#8 PEM
    pem = Path(files.key).read_bytes()
    assert pem.startswith(b"-----BEGIN PRIVATE KEY-----\n")
    key = serialization.load_pem_private_key(pem, password=None)
    assert isinstance(key, ec.EllipticCurvePrivateKey) and isinstance(key.curve, ec.SECP384R1)
    assert public_der(key.public_key()) == public_der(link.public_key())  # type: ignore[arg-type]

    # valid from 5 minutes before it was made (clocks a little behind) for 365 days
    for made in (ca, link):
        start, end = made.not_valid_before_utc, made.not_valid_after_utc
        assert end - start == dt.timedelta(days=365, minutes=5)
        # certificates keep whole seconds
        assert before.replace(microsecond=0) - dt.timedelta(minutes=5) <= start <= after - dt.timedelta(minutes=5)


def test_each_call_makes_a_fresh_ca(tmp_path: Path) -> None:
    first, second = make_tls(tmp_path / "a", ["h"]), make_tls(tmp_path / "b", ["h"])
    assert public_der(cert(first.ca).public_key()) != public_der(cert(second.ca).public_key())  # type: ignore[arg-type]
    with pytest.raises(InvalidSignature):  # the same name, another key
        cert(second.cert).verify_directly_issued_by(cert(first.ca))


@pytest.mark.usefixtures("umask_022")
def test_private_keys_are_the_owners_alone_and_the_rest_readable(tmp_path: Path) -> None:
    files = make_tls(tmp_path / "tls", ["h"])
    pairs = make_node_keys(tmp_path / "node-keys", 2)
    written = [Path(files.ca), Path(files.cert), Path(files.key), *(path for pair in pairs for path in pair)]
    modes = {path.name: path.stat().st_mode & 0o777 for path in written}
    assert modes == {
        "ca.pem": 0o644, "superlink.pem": 0o644, "superlink.key": 0o600,
        "supernode-0.key": 0o600, "supernode-0.pub": 0o644, "supernode-1.key": 0o600, "supernode-1.pub": 0o644,
    }  # fmt: skip


def test_each_supernode_gets_its_own_openssh_p384_key_pair(tmp_path: Path) -> None:
    directory = tmp_path / "run" / "node-keys"
    pairs = make_node_keys(directory, 3)
    assert pairs == [(directory / f"supernode-{i}.key", directory / f"supernode-{i}.pub") for i in range(3)]
    publics = []
    for private, public in pairs:
        # the formats `ssh-keygen -t ecdsa -b 384` writes, which Flower reads
        assert private.read_bytes().startswith(b"-----BEGIN OPENSSH PRIVATE KEY-----\n")
        assert public.read_bytes().startswith(b"ecdsa-sha2-nistp384 ")
        key = serialization.load_ssh_private_key(private.read_bytes(), password=None)
        pub = serialization.load_ssh_public_key(public.read_bytes())
        assert isinstance(key, ec.EllipticCurvePrivateKey) and isinstance(key.curve, ec.SECP384R1)
        assert public_der(key.public_key()) == public_der(pub)  # type: ignore[arg-type]
        publics.append(public_der(pub))  # type: ignore[arg-type]
    assert len(set(publics)) == 3


def test_no_nodes_no_keys(tmp_path: Path) -> None:
    assert make_node_keys(tmp_path / "node-keys", 0) == []
    assert list((tmp_path / "node-keys").iterdir()) == []


@pytest.mark.parametrize("make", [lambda d: make_tls(d, ["h"]), lambda d: make_node_keys(d, 1)], ids=["tls", "nodes"])
def test_nothing_is_written_through_a_link(tmp_path: Path, make: Callable[[Path], object]) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (tmp_path / "deploy").mkdir()
    (tmp_path / "deploy" / "keys").symlink_to(elsewhere)
    with pytest.raises(LinkError, match=r"keys is a symbolic link"):
        make(tmp_path / "deploy" / "keys")
    assert list(elsewhere.iterdir()) == []
