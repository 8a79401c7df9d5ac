"""Reply validation, in process: replies that are not what they claim and nodes that describe
themselves impossibly are rejected or left out (README, "Reliability"). `FaultyGrid` and
`faulty_run` serve the checkpoint and server tests too."""


import numpy as np
import pytest
from flwr.app import Error, Message, MetricRecord, RecordDict

import client_app
from ovalp_flwr.federation import protocol as p
from ovalp_flwr.federation.chaos import KINDS as CHAOS_KINDS, corrupt
from ovalp_flwr.config import RunConfig
from ovalp_flwr.federation.local_grid import InProcessGrid, app_config
from ovalp_flwr.federation.results import read_summary
from server_app import run_server


BAD_PARTITION = 1


# one kind per round, and the words its rejection names
REASONS = {"nan": "non-finite", "inf": "non-finite", "shape": "expected float32", "dtype": "float64",
         "extra-array": "extra ['backdoor']", "examples": "but the node described",
         "steps": "its local schedule takes", "loss": "not a finite number",
         "no-metrics": "lacks"}


class FaultyGrid(InProcessGrid):
    """One node (partition BAD_PARTITION) misbehaves as `fault(round, message, reply)` says;
    the timeouts the rounds were given are remembered."""

    def __init__(self, *args, fault, **kwargs):
        super().__init__(*args, **kwargs)
        self.bad = next(n for n, c in self.contexts.items()
                        if c.node_config["partition-id"] == BAD_PARTITION)
        self.fault = fault
        self.timeouts: list[float | None] = []

    def _deliver(self, message):
        reply = super()._deliver(message)
        if message.metadata.dst_node_id != self.bad:
            return reply
        return self.fault(message, reply)

    def send_and_receive(self, messages, *, timeout=None):
        self.timeouts.append(timeout)
        return [r for r in super().send_and_receive(messages, timeout=timeout) if r is not None]


def faulty_run(cache_dir, tmp_path, fault, rounds: int, name: str, node_configs=None,
               **overrides):
    run_config = {**app_config(), "encoder": "pixels", "feature-cache-dir": str(cache_dir),
                  "results-dir": str(tmp_path / "results"), "num-server-rounds": rounds,
                  "run-name": name, "partition": "iid", **overrides}
    grid = FaultyGrid(client_app.app, 4, run_config, fault=fault, node_configs=node_configs)
    return grid, read_summary(run_server(grid, RunConfig.from_mapping(run_config)))


def in_training(change):
    """A fault that touches only train replies: change(round, message, reply)."""
    def fault(message, reply):
        if message.metadata.message_type != "train" or reply.has_error():
            return reply
        return change(int(message.content[p.CONFIG]["server-round"]), message, reply)
    return fault


def test_every_kind_of_bad_reply_is_rejected_and_leaves_the_global_head_as_if_it_never_came(
        cache_dir, tmp_path, caplog):
    kinds = list(REASONS)
    assert kinds == list(CHAOS_KINDS)
    bad = in_training(lambda r, msg, reply: Message(content=corrupt(kinds[r - 1], reply.content),
                                                    reply_to=msg))
    failed = in_training(lambda r, msg, reply: Message(error=Error(code=0, reason="gone"),
                                                       reply_to=msg))
    _, poisoned = faulty_run(cache_dir, tmp_path, bad, len(kinds), "poisoned")
    _, without = faulty_run(cache_dir, tmp_path, failed, len(kinds), "without")
    for kind, record in zip(kinds, poisoned["rounds"]):
        assert (record["clients_replied"], record["clients_trained"],
                record["clients_rejected"]) == (4, 3, 1), kind
        assert REASONS[kind] in record["rejections"][0]["reason"], (kind, record["rejections"])
    # bit for bit the run in which the node's replies never came
    assert [r["accuracy"] for r in poisoned["rounds"]] == [r["accuracy"] for r in without["rounds"]]
    assert poisoned["final_accuracy"] > 0.85
    warned = [r.getMessage() for r in caplog.records if "rejected (not averaged)" in r.getMessage()]
    assert len(warned) == 1  # once per node


def test_a_node_that_keeps_sending_bad_replies_is_excluded_when_asked(cache_dir, tmp_path):
    """The bad node is the ClientApp's own chaos mod (`--node-config "chaos='nan'"`)."""
    chaos = [{"chaos": "nan"} if i == BAD_PARTITION else {} for i in range(4)]
    _, summary = faulty_run(cache_dir, tmp_path, lambda message, reply: reply, 4, "excluded",
                            node_configs=chaos, **{"exclude-after-rejections": 2})
    assert [(r["clients_sampled"], r["clients_rejected"]) for r in summary["rounds"]] == [
        (4, 1), (4, 1), (3, 0), (3, 0)]


@pytest.mark.parametrize("kind, reason", [
    ("examples", "more than the dataset's"), ("statistics", "non-finite")])
def test_a_node_that_describes_itself_impossibly_is_left_out(cache_dir, tmp_path, caplog,
                                                             kind, reason):
    def fault(message, reply):
        content = reply.content
        if kind == "examples" and message.metadata.message_type == p.DESCRIBE:
            metrics = dict(content[p.METRICS])
            metrics[p.NUM_EXAMPLES] = 10**9
            content = RecordDict({**content, p.METRICS: MetricRecord(metrics)})
        if kind == "statistics" and p.STATISTICS in content:
            statistics = p.from_record(content[p.STATISTICS])
            statistics["sums"][0, 0] = np.nan
            content = RecordDict({**content, p.STATISTICS: p.to_record(statistics)})
        return Message(content=content, reply_to=message)

    _, summary = faulty_run(cache_dir, tmp_path, fault, 2, f"setup-{kind}")
    assert [r["clients_sampled"] for r in summary["rounds"]] == [3, 3]
    assert summary["head_init"]["clients_sent"] == 3
    assert summary["final_accuracy"] > 0.85
    left_out = [r.getMessage() for r in caplog.records if "left out" in r.getMessage()]
    assert len(left_out) == 1 and reason in left_out[0]


@pytest.mark.parametrize("change, words", [
    ({p.CURVATURE: [0.1, 0.3]}, "entries outside [0, 0.25]"),
    ({p.CURVATURE: [0.1]}, "not a list of 2 finite numbers"),
    ({p.LOSSES: [0.2, float("nan")]}, "not a list of 2 finite numbers"),
    ({p.LOSSES: [0.7, -0.2]}, "not 2 numbers >= 0 adding up to train-loss=0.5"),
    ({p.LOSSES: [0.3, 0.3]}, "(sum 0.6) are not 2 numbers >= 0 adding up to"),
])
def test_a_gradient_reply_with_impossible_curvature_or_losses_is_refused(change, words):
    """The server's L-BFGS line-searches each OvA head on the losses the clients send: they must
    be K numbers >= 0 that add up to the reply's loss, and each curvature a mean of σ(1-σ)."""
    from ovalp_flwr.federation.validation import check_gradient_metrics

    good = {p.TRAIN_LOSS: 0.5, p.CURVATURE: [0.1, 0.2], p.LOSSES: [0.2, 0.3]}
    assert check_gradient_metrics(good, 2) is None
    assert words in check_gradient_metrics({**good, **change}, 2)
