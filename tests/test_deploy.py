"""A real deployment on loopback: flower-superlink + 3 flower-supernode processes."""

import json

import pytest

from ovalp_flwr import deploy
from test_flwr_run import left_behind  # tests/ is on sys.path under pytest

pytestmark = pytest.mark.e2e


def test_three_supernodes_with_their_own_caches_complete_a_run(tmp_path, capfd):
    flwr_home, results = tmp_path / "flwr-home", tmp_path / "results"
    run_config = (f"encoder='pixels' num-server-rounds=2 partition='iid' run-name='deploy' "
                  f"results-dir='{results}' feature-cache-dir='{tmp_path / 'server-cache'}'")
    code = deploy.main(["-n", "3", "--node-dir", str(tmp_path / "node{i}"),
                        "--flwr-home", str(flwr_home), "--", "--run-config", run_config])
    out = capfd.readouterr().out
    assert code == 0, out[-3000:]
    summary = json.loads((results / "deploy" / "summary.json").read_text())
    assert summary["num_clients"] == 3 and [r["round"] for r in summary["rounds"]] == [1, 2]
    assert summary["partition"]["kind"] == "iid of node-local data"
    assert summary["final_accuracy"] > 0.5
    for i in range(3):  # each SuperNode built and kept its own cache and rows
        cache = tmp_path / f"node{i}" / "cache"
        assert (cache / "digits__pixels" / "manifest.json").exists()
        assert len(list((cache / ".rows").rglob("*.safetensors"))) == 1
    assert left_behind(flwr_home) == set(), "the deployment left processes behind"
