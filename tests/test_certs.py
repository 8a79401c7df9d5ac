"""Throwaway TLS certificates and SuperNode keys (`python -m ovalp_flwr.ops.certs`), as Flower's
SuperLink and SuperNodes read them."""

import ipaddress
import stat

from cryptography import x509
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.serialization import load_ssh_private_key, load_ssh_public_key

from ovalp_flwr.ops import certs

def test_certs_are_what_flower_expects_and_private_keys_are_0600(tmp_path):
    assert certs.main([str(tmp_path), "--nodes", "2"]) == 0
    for name in ("ca.key", "server.key", "supernode-0", "supernode-1"):
        assert stat.S_IMODE((tmp_path / name).stat().st_mode) == 0o600, name
    server = x509.load_pem_x509_certificate((tmp_path / "server.pem").read_bytes())
    ca = x509.load_pem_x509_certificate((tmp_path / "ca.crt").read_bytes())
    server.verify_directly_issued_by(ca)
    san = server.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert san.get_values_for_type(x509.IPAddress) == [ipaddress.ip_address("127.0.0.1")]
    assert set(san.get_values_for_type(x509.DNSName)) == {"localhost", "superlink"}
    private = load_ssh_private_key((tmp_path / "supernode-0").read_bytes(), None)
    public = load_ssh_public_key((tmp_path / "supernode-0.pub").read_bytes())
    assert isinstance(private.curve, ec.SECP384R1) and isinstance(public, ec.EllipticCurvePublicKey)
    assert private.public_key() == public


def test_the_files_can_be_given_to_the_containers_user_keeping_keys_0600(tmp_path, monkeypatch):
    """compose.tls.yml's containers run as uid 49999 and must read their keys."""
    given: dict = {}
    monkeypatch.setattr(certs.os, "chown", lambda path, uid, gid: given.update({path: (uid, gid)}))
    certs.make_all(tmp_path, 2, owner=certs.CONTAINER_UID)
    assert set(given) == {tmp_path, *tmp_path.iterdir()}
    assert set(given.values()) == {(49999, 49999)}
    assert stat.S_IMODE((tmp_path / "supernode-1").stat().st_mode) == 0o600


def test_a_refused_chown_is_one_line_naming_the_owner_and_the_fix(tmp_path, monkeypatch, capsys):
    def refuse(*_):
        raise PermissionError(1, "Operation not permitted")

    monkeypatch.setattr(certs.os, "chown", refuse)
    assert certs.main([str(tmp_path), "--nodes", "1", "--owner", "49999"]) == 2
    error = capsys.readouterr().err.strip()
    assert "\n" not in error and error.startswith("owner=49999:")
    assert f"sudo chown -R 49999:49999 {tmp_path}" in error
