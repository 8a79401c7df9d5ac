"""Throwaway TLS certificates and SuperNode auth keys for a local secure deployment.

    python -m ovalp_flwr.ops.certs .flwr-deploy/certs --nodes 3

Writes, under <dir>:
    ca.crt, ca.key                      a self-signed CA (valid 30 days)
    server.pem, server.key              the SuperLink's certificate, signed by the CA
                                        (SAN: 127.0.0.1, localhost, superlink)
    supernode-<i>, supernode-<i>.pub    SuperNode i's EC key pair (SECP384R1), OpenSSH
                                        format, as `flower-supernode
                                        --auth-supernode-private-key` and `flwr supernode
                                        register` expect
Private keys are written with mode 0600. They are secrets: keep <dir> out of git.
For the compose demo's containers, which run as the Flower images' user `app`, add
`--owner 49999` (as root): the files are then that user's, still 0600.
"""

from __future__ import annotations

import argparse
import datetime
import ipaddress
import os
import sys
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

DEFAULT_DIR = Path(".flwr-deploy/certs")
SERVER_NAMES = ("127.0.0.1", "localhost", "superlink")
VALID_DAYS = 30
CA_CERT, SERVER_CERT, SERVER_KEY = "ca.crt", "server.pem", "server.key"  # what Flower is given
CONTAINER_UID = 49999  # user `app` of Flower's official images (and of our stand-ins)


@dataclass
class ServerCerts:
    ca_cert: Path
    server_cert: Path
    server_key: Path


def _write(path: Path, data: bytes, private: bool = False) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    if private:  # created 0600 from the start, never readable by others
        if path.exists():
            path.unlink()
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
        os.chmod(path, 0o600)
    else:
        path.write_bytes(data)
    return path


def _pem_key(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.ORGANIZATION_NAME, "ovalp-flwr local deployment"),
                      x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def make_server_certs(directory: Path, names: tuple[str, ...] = SERVER_NAMES) -> ServerCerts:
    """A CA and a server certificate signed by it, for the SuperLink."""
    now = datetime.datetime.now(datetime.timezone.utc)
    start, end = now - datetime.timedelta(minutes=5), now + datetime.timedelta(days=VALID_DAYS)

    ca_key = ec.generate_private_key(ec.SECP384R1())
    ca_name = _name("ovalp-flwr throwaway CA")
    ca_cert = (x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name)
               .public_key(ca_key.public_key()).serial_number(x509.random_serial_number())
               .not_valid_before(start).not_valid_after(end)
               .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
               .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True,
                                            crl_sign=True, content_commitment=False,
                                            key_encipherment=False, data_encipherment=False,
                                            key_agreement=False, encipher_only=False,
                                            decipher_only=False), critical=True)
               .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()),
                              critical=False)
               .sign(ca_key, hashes.SHA384()))

    server_key = ec.generate_private_key(ec.SECP384R1())
    alt_names: list[x509.GeneralName] = []
    for name in names:
        try:
            alt_names.append(x509.IPAddress(ipaddress.ip_address(name)))
        except ValueError:
            alt_names.append(x509.DNSName(name))
    server_cert = (x509.CertificateBuilder().subject_name(_name(names[0]))
                   .issuer_name(ca_name).public_key(server_key.public_key())
                   .serial_number(x509.random_serial_number())
                   .not_valid_before(start).not_valid_after(end)
                   .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
                   .add_extension(x509.SubjectAlternativeName(alt_names), critical=False)
                   .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]),
                                  critical=False)
                   .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(
                       ca_key.public_key()), critical=False)
                   .sign(ca_key, hashes.SHA384()))

    pem = serialization.Encoding.PEM
    _write(directory / "ca.key", _pem_key(ca_key), private=True)
    return ServerCerts(
        ca_cert=_write(directory / CA_CERT, ca_cert.public_bytes(pem)),
        server_cert=_write(directory / SERVER_CERT, server_cert.public_bytes(pem)),
        server_key=_write(directory / SERVER_KEY, _pem_key(server_key), private=True),
    )


def make_node_keys(directory: Path, name: str) -> tuple[Path, Path]:
    """One SuperNode's EC key pair, OpenSSH format: (private key, public key)."""
    key = ec.generate_private_key(ec.SECP384R1())
    private = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH,
                                serialization.NoEncryption())
    public = key.public_key().public_bytes(serialization.Encoding.OpenSSH,
                                           serialization.PublicFormat.OpenSSH)
    return (_write(directory / name, private, private=True),
            _write(directory / f"{name}.pub", public + b"\n"))


def node_key_name(i: int) -> str:
    return f"supernode-{i}"


def make_all(directory: Path, nodes: int, owner: int | None = None
             ) -> tuple[ServerCerts, list[tuple[Path, Path]]]:
    """Everything a secure deployment needs. `owner`: a uid to give every file to (the
    containers' user reads its private key, which stays 0600)."""
    server = make_server_certs(directory)
    keys = [make_node_keys(directory, node_key_name(i)) for i in range(nodes)]
    if owner is not None:
        give_to(directory, owner)
    return server, keys


def give_to(directory: Path, owner: int) -> None:
    try:
        for path in [directory, *directory.iterdir()]:
            os.chown(path, owner, owner)
    except PermissionError as err:
        raise PermissionError(f"owner={owner}: cannot give {directory}'s files to uid {owner} "
                              f"({err.strerror}); run as root, or `sudo chown -R {owner}:{owner} "
                              f"{directory}`") from None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ovalp_flwr.ops.certs",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("dir", type=Path, nargs="?", default=DEFAULT_DIR,
                        help=f"where to write (default {DEFAULT_DIR}; keep it git-ignored)")
    parser.add_argument("--nodes", type=int, default=3,
                        help="SuperNode key pairs to make (default: %(default)s)")
    parser.add_argument("--owner", type=int, default=None,
                        help=f"give the files to this uid (as root; {CONTAINER_UID} = the "
                             "Flower images' user, for the compose demo)")
    args = parser.parse_args(argv)
    try:
        server, keys = make_all(args.dir, args.nodes, args.owner)
    except PermissionError as err:
        print(err, file=sys.stderr)
        return 2
    print(f"CA certificate:       {server.ca_cert}  (key {args.dir / 'ca.key'}, 0600)")
    print(f"SuperLink cert/key:   {server.server_cert}  {server.server_key} (0600)"
          f"  SAN: {', '.join(SERVER_NAMES)}")
    for private, public in keys:
        print(f"SuperNode key pair:   {private} (0600)  {public}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
