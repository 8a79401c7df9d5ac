"""The statistics under Flower's SecAgg+: the server gets the sums, and only the sums."""


import numpy as np
import pytest

import client_app
from flwr.app import Error, Message
from ovalp_flwr.federation import protocol as p
from ovalp_flwr.federation import secure_sum
from ovalp_flwr.config import RunConfig
from ovalp_flwr.core.head_init import ClassStatistics
from ovalp_flwr.federation.local_grid import InProcessGrid, app_config, run_local
from ovalp_flwr.federation.results import read_summary
from ovalp_flwr.federation.exchange import FederationError
from ovalp_flwr.federation.setup import StatisticsSum
from server_app import run_server

CLIENTS = 12


class Recording(InProcessGrid):
    """Keeps every reply the server receives, to show what it could see; the partitions in
    `gone` drop out of SecAgg+ before they upload their masked vector (plain: never connect)."""

    def __init__(self, *args, gone=(), **kwargs):
        super().__init__(*args, **kwargs)
        self.replies = []
        self.gone = {node for node, context in self.contexts.items()  # partitions -> nodes
                     if context.node_config["partition-id"] in set(gone)}
        self.secure = args[2]["statistics-aggregation"] == "secagg+"  # the run config
        if not self.secure:  # plain: never connected, so the others' sums are the reference
            self.offline |= self.gone

    def _deliver(self, message):
        if message.metadata.dst_node_id in self.gone and _drops_out_at(message, self.secure):
            return Message(error=Error(code=0, reason="dropped out"), reply_to=message)
        reply = super()._deliver(message)
        self.replies.append(reply)
        return reply


def _drops_out_at(message, secure: bool) -> bool:
    from flwr.common.secure_aggregation.secaggplus_constants import Key, Stage

    secagg = message.content.config_records.get(p.SECAGG_CONFIGS)
    return secagg is not None and secagg.get(Key.STAGE) == Stage.COLLECT_MASKED_VECTORS


def run(cache_dir, tmp_path, aggregation, partition="shard", clients=CLIENTS, gone=(),
        **overrides):
    """One run without rounds; the summed statistics as the server got them, and the grid."""
    config = {**app_config(), "encoder": "pixels", "feature-cache-dir": str(cache_dir),
              "results-dir": str(tmp_path / aggregation), "run-name": "t", "partition": partition,
              "num-server-rounds": 0, "statistics-aggregation": aggregation, **overrides}
    grid = Recording(client_app.app, clients, config, gone=gone)
    sums = []
    original = StatisticsSum.__init__

    def keep(self, **options):
        original(self, **options)
        sums.append(self)

    StatisticsSum.__init__ = keep
    try:
        summary = read_summary(run_server(grid, RunConfig.from_mapping(config)))
    finally:
        StatisticsSum.__init__ = original
    return summary, sums[0].total, grid


@pytest.mark.parametrize("partition", ["shard", "bernoulli-dirichlet", "zipf"])
def test_secagg_sums_are_the_plain_sums_to_its_quantisation(cache_dir, tmp_path, partition):
    plain, plain_sums, _ = run(cache_dir, tmp_path, "plain", partition)
    secure, secure_sums, _ = run(cache_dir, tmp_path, "secagg+", partition)
    for field in ("counts", "sums", "square_norms", "gram"):  # to 1e-3 of each one's scale
        exact, masked = getattr(plain_sums, field), getattr(secure_sums, field)
        np.testing.assert_allclose(masked, exact, atol=1e-3 * np.abs(exact).max())
    assert secure["initial_accuracy"] == pytest.approx(plain["initial_accuracy"], abs=1 / 360)
    assert secure["head_init"]["aggregation"] == "secagg+"
    assert secure["head_init"]["clients_sent"] == plain["head_init"]["clients_sent"]
    assert secure["setup"]["messages"] == plain["setup"]["messages"] + 4 * CLIENTS  # 4 stages


def test_secagg_keeps_l2_features_statistics_exact_by_quantising_over_their_bound(cache_dir,
                                                                                 tmp_path):
    """l2 rows bound every per-sample statistic by 1: quantised over ±1 instead of ±1024, the
    sums come back to 1e-5 of their scale (over ±1024 a per-sample Gram entry, about 1/D, was
    quantised to about its own size, and TinyImageNet-100's start fell from 65.7% to 6.9%)."""
    plain, plain_sums, _ = run(cache_dir, tmp_path, "plain", **{"feature-norm": "l2"})
    secure, secure_sums, _ = run(cache_dir, tmp_path, "secagg+", **{"feature-norm": "l2"})
    for field in ("counts", "sums", "square_norms", "gram"):
        exact, masked = getattr(plain_sums, field), getattr(secure_sums, field)
        np.testing.assert_allclose(masked, exact, atol=1e-5 * np.abs(exact).max())
    assert secure["initial_accuracy"] == plain["initial_accuracy"]
    assert secure_sum.statistics_range(1.0) == 1.0
    assert secure_sum.statistics_range(None) == secure_sum.CLIPPING_RANGE


def test_under_secagg_no_reply_carries_a_clients_statistics(cache_dir, tmp_path):
    """Plain: set_norm replies hold each client's class sums. SecAgg+: no reply holds them,
    and the one vector each client uploads is masked (it looks nothing like its statistics)."""
    _, _, plain_grid = run(cache_dir, tmp_path, "plain")
    assert sum(p.STATISTICS in r.content for r in plain_grid.replies) == CLIENTS
    _, sums, grid = run(cache_dir, tmp_path, "secagg+")
    assert not any(p.STATISTICS in r.content for r in grid.replies if not r.has_error())
    from flwr.common import bytes_to_ndarray
    from flwr.common.secure_aggregation.secaggplus_constants import Key

    masked = [r.content[p.SECAGG_CONFIGS][Key.MASKED_PARAMETERS] for r in grid.replies
              if not r.has_error()
              and Key.MASKED_PARAMETERS in r.content.config_records.get(p.SECAGG_CONFIGS, {})]
    assert len(masked) == CLIENTS
    upload = bytes_to_ndarray(masked[0][1])  # [0] is the masked weight, [1] the statistics
    assert upload.size == sums.per_sample_vector().size
    assert np.unique(upload).size > 0.99 * upload.size  # uniform masks, not counts and sums


def test_a_client_whose_statistics_exceed_the_clipping_range_stops_the_run_naming_why(
        cache_dir, tmp_path, monkeypatch):
    monkeypatch.setattr(secure_sum, "CLIPPING_RANGE", 0.5)
    with pytest.raises(FederationError, match=r"statistics-aggregation='secagg\+': SecAgg\+ did "
                       r"not complete.* said: .*outside SecAgg\+'s clipping range ±0.5"):
        run(cache_dir, tmp_path, "secagg+")


def test_the_per_sample_vector_round_trips(cache_dir):
    rng = np.random.default_rng(0)
    import torch

    features = torch.from_numpy(rng.normal(size=(40, 6)).astype(np.float32))
    stats = ClassStatistics.of(features, torch.from_numpy(np.arange(40) % 3), 3, True)
    back = ClassStatistics.from_per_sample_vector(stats.per_sample_vector(), 40, 3, 6)
    for field in ("counts", "sums", "square_norms", "gram"):
        np.testing.assert_allclose(getattr(back, field), getattr(stats, field), rtol=1e-6)


def test_the_secagg_config_key_is_flowers_and_levels_never_overflow_the_modulus():
    from flwr.common.secure_aggregation.secaggplus_constants import RECORD_KEY_CONFIGS

    assert p.SECAGG_CONFIGS == RECORD_KEY_CONFIGS
    for clients in (2, 3, 100, 1000):
        assert clients * secure_sum.quantization_range(clients) <= secure_sum.MODULUS_RANGE // 2


def test_secagg_runs_whole_federations_and_small_ones(cache_dir, tmp_path):
    summary = read_summary(run_local({
        "encoder": "pixels", "feature-cache-dir": str(cache_dir), "results-dir": str(tmp_path),
        "run-name": "t", "num-server-rounds": 2, "statistics-aggregation": "secagg+",
        "partition": "iid"}, 3))
    assert summary["head_init"]["aggregation"] == "secagg+" and summary["initial_accuracy"] > 0.85
    assert [r["clients_trained"] for r in summary["rounds"]] == [3, 3]


def test_a_client_dropping_out_of_secagg_ends_the_run_unless_drop_outs_are_allowed(cache_dir,
                                                                                   tmp_path):
    victim = 3  # a partition
    with pytest.raises(FederationError, match=r"no client may drop out \(secagg-dropouts = 0\)"):
        run(cache_dir, tmp_path, "secagg+", gone={victim})
    rows = {"feature-norm": "l2"}  # each row on its own: the same rows whoever takes part
    plain, plain_sums, _ = run(cache_dir, tmp_path, "plain", gone={victim}, **rows)
    secure, secure_sums, _ = run(cache_dir, tmp_path / "allowed", "secagg+", gone={victim},
                                 **rows, **{"secagg-dropouts": 0.25})
    assert secure_sums.num_samples == plain_sums.num_samples  # the eleven others' rows
    for field in ("counts", "sums", "square_norms", "gram"):
        exact, masked = getattr(plain_sums, field), getattr(secure_sums, field)
        np.testing.assert_allclose(masked, exact, atol=1e-5 * np.abs(exact).max())
    assert secure["head_init"]["clients_sent"] == CLIENTS - 1
    assert secure["head_init"]["secagg_dropped"] == [victim]
    with pytest.raises(FederationError, match=r"it needs 11 clients holding data back"):
        run(cache_dir, tmp_path / "two", "secagg+", gone={victim, victim + 5},
            **{"secagg-dropouts": 0.1})  # 12 - floor(1.2) = 11 needed, 10 came back


def test_drop_outs_need_the_secure_sum_and_a_share_below_a_half():
    from ovalp_flwr.config import ConfigError

    with pytest.raises(ConfigError, match=r'secagg-dropouts.*statistics-aggregation="secagg\+"'):
        RunConfig.from_mapping({"secagg-dropouts": 0.1})
    with pytest.raises(ConfigError, match=r"secagg-dropouts.*majority.*\[0, 0.5\)"):
        RunConfig.from_mapping({"secagg-dropouts": 0.5, "statistics-aggregation": "secagg+"})
    assert [secure_sum.fewest_survivors(12, share) for share in (0, 0.1, 0.25, 0.5, 0.99)] \
        == [12, 11, 9, 6, 1]


@pytest.mark.parametrize("clients", [2, 3, 7, 12, 100, 1000, 10_000])
def test_secagg_is_sized_to_the_sum_with_a_majority_threshold(clients):
    shares, threshold = secure_sum.secagg_sizing(clients)
    assert shares == clients or (shares % 2 == 1 and shares >= 0.2 * clients)
    assert min(clients, secure_sum.FEWEST_SHARES) <= shares <= clients
    assert shares / 2 < threshold <= shares  # a strict majority of the shares
    assert threshold >= min(clients, 2)
