"""A secure deployment on loopback: TLS + SuperNode authentication (`deploy --tls`)."""

import ipaddress
import json
import stat
import time

import pytest
from cryptography import x509
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.serialization import load_ssh_private_key, load_ssh_public_key

from ovalp_flwr import certs, deploy
from test_flwr_run import left_behind  # tests/ is on sys.path under pytest

pytestmark = pytest.mark.e2e


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


def wait_for_exit(process, timeout: float) -> int | None:
    deadline = time.monotonic() + timeout
    while process.poll() is None and time.monotonic() < deadline:
        time.sleep(0.5)
    return process.poll()


def test_tls_and_node_auth_run_to_completion_and_refuse_an_unregistered_node(tmp_path):
    """With the statistics under SecAgg+ too: its key shares and masks survive a fresh ClientApp
    process per message (the mod's state lives in the node's context)."""
    flwr_home, results = tmp_path / "flwr-home", tmp_path / "results"
    run_config = (f"encoder='pixels' num-server-rounds=2 partition='iid' run-name='tls' "
                  f"results-dir='{results}' feature-cache-dir='{tmp_path / 'cache'}' "
                  "statistics-aggregation='secagg+'")
    logs = flwr_home / "deploy"
    with deploy.local_deployment(3, flwr_home, secure=True) as deployment:
        config = (flwr_home / "config.toml").read_text()
        assert "root-certificates" in config and "insecure" not in config

        # a SuperNode whose key pair was never registered: the SuperLink refuses it
        private, _ = certs.make_node_keys(deployment.certs, "intruder")
        intruder = deploy.start_supernode(deployment, 3, 4, None, private_key=private,
                                          register=False, log_stem="intruder")
        exit_code = wait_for_exit(intruder.supernode, timeout=60)
        intruder.stop()
        intruder_log = (logs / "intruder.log").read_text(errors="replace")
        assert exit_code not in (None, 0), intruder_log[-2000:]
        assert "Failed to activate SuperNode" in intruder_log, intruder_log[-2000:]
        assert "SuperNode ID" not in intruder_log
        superlink_log = (logs / "superlink.log").read_text(errors="replace")
        assert "No SuperNode found with the given public key" in superlink_log

        code, final_line = deploy.run_app(deployment, deploy.PROJECT, ["--run-config", run_config])
    assert code == 0 and final_line.startswith("0."), final_line
    summary = json.loads((results / "tls" / "summary.json").read_text())
    assert summary["num_clients"] == 3 and [r["round"] for r in summary["rounds"]] == [1, 2]
    assert summary["head_init"]["aggregation"] == "secagg+" and summary["initial_accuracy"] > 0.85
    for i in range(3):  # registered nodes were activated over TLS
        assert "SuperNode ID" in (logs / f"supernode-{i}.log").read_text(errors="replace")
    assert (logs / "superlink.log").read_text().count("Activated node_id") == 3
    assert left_behind(flwr_home) == set(), "the deployment left processes behind"
