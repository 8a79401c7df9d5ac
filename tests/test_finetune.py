"""The encoder path (`finetune`): LoRA aggregation by hand, what travels, frozen tensors
untouched, FLoRA's nodes in step, one-line config errors; tiny random encoders on a CPU."""

import json

import numpy as np
import pytest
import torch

from client_app import app as client_app
from ovalp_flwr.federation import protocol as p
from ovalp_flwr.config import ConfigError, RunConfig
from ovalp_flwr.finetune import client as finetune_client
from ovalp_flwr.finetune.methods import make_method
from ovalp_flwr.finetune.flora import FLoRA, STATE_DELTA, STATE_ROUND
from ovalp_flwr.finetune.lora import LoRAOptions, delta_weight
from ovalp_flwr.federation.local_grid import InProcessGrid, app_config
from server_app import run_server
from ovalp_flwr.federation.strategy import StagedFedAvg

BASE = {"encoder": "tiny-cnn", "dataset": "digits", "head-init": "random",
        "limit-per-class": 12, "num-server-rounds": 2, "local-epochs": 1, "batch-size": 8,
        "partition": "shard", "classes-per-client": 3, "checkpoint-every": 0}


class RecordingGrid(InProcessGrid):
    """Keeps every train message and reply that went through it."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.trains: list[tuple] = []

    def _deliver(self, message):
        reply = super()._deliver(message)
        if message.metadata.message_type == "train":
            self.trains.append((message, reply))
        return reply


def setup_of(config: RunConfig) -> finetune_client.Setup:
    """The process's setup for `config`, as its server and in-process clients build it."""
    return finetune_client.setup(config.data, config.finetuning, config.seed, config.device)


def run(tmp_path, num_nodes=4, **overrides):
    """One in-process run; returns (summary, grid, the run's process-wide setup)."""
    run_config = {**app_config(), **BASE, "results-dir": str(tmp_path / "results"),
                  "run-name": "run", **overrides}
    config = RunConfig.from_mapping(run_config)
    grid = RecordingGrid(client_app, num_nodes, run_config, seed=config.seed)
    out = run_server(grid, config)
    return json.loads((out / "summary.json").read_text()), grid, setup_of(config)


# --- aggregation, by hand ----------------------------------------------------------------


def test_fedavg_lora_averages_a_and_b_apart_and_flora_stacks_them_exactly():
    """Two clients of a 2x2 layer with rank 1, weights 1 and 3: FedAvg-LoRA's update is
    (mean B)(mean A), FLoRA's the weighted mean of B_k A_k; numbers worked out by hand."""
    a1, b1 = np.array([[1.0, 0.0]], np.float32), np.array([[1.0], [0.0]], np.float32)
    a2, b2 = np.array([[0.0, 2.0]], np.float32), np.array([[0.0], [1.0]], np.float32)
    key_a, key_b = "network.fc.lora_A.default.weight", "network.fc.lora_B.default.weight"
    replies = [({key_a: a1, key_b: b1}, 1.0), ({key_a: a2, key_b: b2}, 3.0)]
    scaling = 2.0  # alpha 2 / rank 1
    # FedAvg-LoRA: mean A = [[0.25, 1.5]] (weights 1/4, 3/4), mean B = [[0.25], [0.75]];
    # their product [[0.0625, 0.375], [0.1875, 1.125]], times 2
    mean_a = (a1 * 1 + a2 * 3) / 4
    mean_b = (b1 * 1 + b2 * 3) / 4
    fedavg = delta_weight(torch.from_numpy(mean_a), torch.from_numpy(mean_b), scaling).numpy()
    np.testing.assert_array_equal(fedavg, [[0.125, 0.75], [0.375, 2.25]])
    # what the clients learned: 1/4 B1 A1 + 3/4 B2 A2 = [[0.25, 0], [0, 1.5]], times 2
    flora = FLoRA(LoRAOptions(rank=1, alpha=2.0))
    stack = flora.stack(replies)
    np.testing.assert_array_equal(stack["network.fc/A"], [[1.0, 0.0], [0.0, 2.0]])
    np.testing.assert_array_equal(stack["network.fc/B"], [[0.25, 0.0], [0.0, 0.75]])
    merged = flora.merged({}, stack)["network.fc.base_layer.weight"]
    np.testing.assert_array_equal(merged, [[0.5, 0.0], [0.0, 3.0]])
    assert not np.allclose(fedavg, merged)  # the cross terms FedAvg-LoRA adds
    # merging is additive over rounds: a second round's stack adds to the first's
    np.testing.assert_array_equal(flora.merged({"network.fc.base_layer.weight": merged}, stack)
                                  ["network.fc.base_layer.weight"], 2 * merged)


def test_the_fedavg_strategy_averages_lora_tensors_like_any_array():
    """FedAvg-LoRA is the staged FedAvg over A and B: each averaged on its own."""
    from flwr.app import Message, MetricRecord, RecordDict

    from ovalp_flwr.federation.local_grid import InProcessGrid  # noqa: F401  (sets the task identity)

    InProcessGrid(client_app, 1, app_config())
    strategy = StagedFedAvg(stage_for_round=lambda r: 2, seed=0)
    replies = []
    for node, (a, weight) in enumerate([(np.ones((1, 2), np.float32), 1), (3 * np.ones((1, 2), np.float32), 3)]):
        content = RecordDict({p.ARRAYS: p.to_record({"x.lora_A.default.weight": a}),
                              p.METRICS: MetricRecord({p.NUM_EXAMPLES: weight, p.TRAIN_LOSS: 0.0,
                                                       p.TRAIN_SECONDS: 0.0, p.LOCAL_STEPS: 1})})
        message = Message(content=content, message_type="train", dst_node_id=node + 1)
        replies.append(Message(content=content, reply_to=message))
    arrays, _ = strategy.aggregate_train(1, replies)
    np.testing.assert_allclose(arrays["x.lora_A.default.weight"].numpy(), 2.5 * np.ones((1, 2)))


# --- runs on tiny encoders -----------------------------------------------------------------


@pytest.mark.parametrize("method", ["lp", "fedavg-lora", "flora", "full"])
def test_only_the_trainable_tensors_travel(tmp_path, method):
    overrides = {"finetune": method}
    if method == "flora":
        overrides["drift-correction"] = "none"
    summary, grid, built = run(tmp_path, **overrides)
    trainable = {n for n, q in built.model.named_parameters() if q.requires_grad}
    everything = set(built.model.state_dict())
    assert grid.trains
    for message, reply in grid.trains:
        assert set(message.content[p.ARRAYS].keys()) == trainable
        assert set(reply.content[p.ARRAYS].keys()) == trainable
    heads = {"weight", "bias"}
    if method == "lp":
        assert trainable == heads
    elif method == "full":
        assert trainable == {n for n, _ in built.model.named_parameters()}
    else:
        assert trainable - heads and all(".lora_" in n for n in trainable - heads)
        assert len(trainable) < len(everything) / 2
    assert summary["finetune"]["trainable_parameters"] == sum(
        q.numel() for q in built.model.parameters() if q.requires_grad)
    assert len(summary["rounds"]) == 2 and all(r["clients_trained"] == 4 for r in summary["rounds"])


@pytest.mark.parametrize("method", ["lp", "fedavg-lora"])
def test_frozen_tensors_are_bit_identical_after_a_run(tmp_path, method):
    """The encoder's frozen weights and BatchNorm statistics, after the clients trained and the
    server evaluated on the same (in-process) model, are the pretrained ones."""
    config = RunConfig.from_mapping({**app_config(), **BASE, "finetune": method})
    finetune_client._SETUP.clear()
    before = make_method(config.finetuning).frozen_state(setup_of(config).model)
    _, _, built = run(tmp_path, finetune=method)
    after = built.method.frozen_state(built.model)
    assert set(before) == set(after) and len(after) > 10
    for name, tensor in before.items():
        assert torch.equal(tensor, after[name]), name
    # and the trainable ones did move
    start = built.model.weight.detach().clone()
    assert start.abs().sum() > 0


def test_a_second_run_in_the_same_process_starts_from_the_seeded_model(tmp_path):
    """The process's model is trained in place by in-process clients; the next run (a sweep's)
    must still start from the seeded one, not from where the last run left it."""
    first, _, _ = run(tmp_path / "first", finetune="fedavg-lora")
    second, _, _ = run(tmp_path / "second", finetune="fedavg-lora")
    assert [r["train_loss"] for r in first["rounds"]] == [r["train_loss"] for r in second["rounds"]]


def test_encoder_clients_that_keep_their_scaffold_variates_give_the_same_rounds(tmp_path):
    """FedAvg-LoRA with scaffold-variates = "clients": each node uploads its c_i over the
    trainable tensors, holds it for round 3 (stage 2's first corrections), and the rounds are
    the server mode's, bit for bit."""
    server, _, _ = run(tmp_path / "server", finetune="fedavg-lora", **{"num-server-rounds": 3})
    clients, grid, built = run(tmp_path / "clients", finetune="fedavg-lora",
                               **{"num-server-rounds": 3, "scaffold-variates": "clients"})
    trainable = {n for n, q in built.model.named_parameters() if q.requires_grad}
    assert all(set(reply.content[p.VARIATE].keys()) == trainable for _, reply in grid.trains)
    assert sum(p.SHARED_VARIATE in m.content for m, _ in grid.trains) == 4  # round 3's
    same = ("accuracy", "train_loss", "clients_trained")
    assert [[r[k] for k in same] for r in server["rounds"]] == \
        [[r[k] for k in same] for r in clients["rounds"]]


def test_flora_nodes_that_sat_rounds_out_merge_what_they_missed(tmp_path):
    """With half the nodes per round, each node's merged update is the server's after the
    rounds it was sent: equal, to the bit, for nodes at the same round; the server's model is
    the pretrained encoder plus its merged update."""
    summary, grid, built = run(tmp_path, num_nodes=4, finetune="flora", **{
        "drift-correction": "none", "fraction-train": 0.5, "num-server-rounds": 4})
    states = {}
    for context in grid.contexts.values():
        if STATE_ROUND in context.state:
            rnd = int(context.state[STATE_ROUND]["round"])
            states.setdefault(rnd, []).append(p.from_record(context.state[STATE_DELTA]))
    assert states and max(states) >= 2
    for deltas in states.values():
        for other in deltas[1:]:
            for key in deltas[0]:
                np.testing.assert_array_equal(deltas[0][key], other[key])
    sent = [r["bytes_sent_per_client"] for r in summary["rounds"]]
    assert sent[1] > sent[0]  # from round 2 the stacks ride along
    assert isinstance(built.method, FLoRA)
    for name, pristine in built.method.pristine.items():
        assert pristine.shape == dict(built.model.named_parameters())[name].shape


@pytest.mark.parametrize("name", ["tiny-cnn", "tiny-bert", "minilm", "efficientnet-lite0"])
def test_full_fine_tuning_reaches_every_parameter_of_the_encoder(name):
    """Every tensor that full fine-tuning sends gets a gradient: MiniLM was built with BERT's
    pooler, which mean pooling never reads, and its None gradient failed every client."""
    from ovalp_flwr.features.encoders import load_encoder
    from ovalp_flwr.finetune.full import FullFineTuning
    from ovalp_flwr.finetune.model import build_classifier

    encoder = load_encoder(name, device="cpu", pretrained=False)
    model = FullFineTuning().prepare(build_classifier(encoder, 4, 0, torch.device("cpu")))
    if encoder.modality == "text":
        tokens = encoder.tokenize(["a short text", "and another, longer one"])
        inputs = torch.stack([tokens["input_ids"], tokens["attention_mask"]], dim=1)
    else:
        inputs = torch.randint(0, 256, (2, 32, 32, 3), dtype=torch.uint8)
    model(inputs).sum().backward()
    missed = [n for n, q in model.named_parameters() if q.requires_grad and q.grad is None]
    assert not missed


def test_a_text_encoder_trains_with_lora_on_its_attention(tmp_path):
    summary, grid, built = run(tmp_path, finetune="fedavg-lora", encoder="tiny-bert",
                               dataset="ag-news", **{"limit-per-class": 10})
    lora = {n for n, q in built.model.named_parameters() if q.requires_grad and ".lora_" in n}
    assert lora and all(".query." in n or ".value." in n for n in lora)
    assert summary["finetune"]["method"] == "fedavg-lora"
    assert summary["rounds"][-1]["clients_trained"] == 4


@pytest.mark.parametrize("key, value, says", [
    ("finetune", "lora", "choose one of: none, lp, fedavg-lora, flora, full"),
    ("head-init", "ridge", "use random or zeros"),
    ("drift-correction", "scaffold", "FLoRA starts fresh"),
    ("resume", True, "FLoRA's nodes hold the stacks they merged"),
])
def test_bad_finetune_settings_get_one_line(key, value, says):
    config = {**app_config(), **BASE, "finetune": "flora", "drift-correction": "none",
              key: value}
    with pytest.raises(ConfigError) as err:
        RunConfig.from_mapping({**config, **({"run-name": "x"} if key == "resume" else {})})
    assert says in str(err.value) and key in str(err.value) and "\n" not in str(err.value)


def test_personalization_moves_the_encoder_after_linear_probing(tmp_path):
    """Encoder-level PFT: after a federated linear probe, FT moves the whole encoder (its
    tensors travel to be scored, features distort), LP only the heads (no distortion)."""
    summary, grid, built = run(tmp_path, num_nodes=3, finetune="lp", personalize="ft lp",
                               **{"pft-epochs": 2, "pft.lp-ft.lp-epochs": 1,
                                  "pft.lss.models": 2})
    methods = summary["personalization"]["methods"]
    assert list(methods) == ["global", "ft", "lp"]
    assert methods["ft"]["summary"]["distortion"] > 0
    assert methods["lp"]["summary"]["distortion"] == 0
    assert all(len(m["clients"]) == 3 for m in methods.values())
    # the encoder stays frozen for the federation: personalization put its flags back
    assert {n for n, q in built.model.named_parameters() if q.requires_grad} == {"weight", "bias"}


def test_a_flora_node_that_lost_its_state_refuses_to_train(tmp_path):
    """Its encoder would lack the merged updates: the round's reply is an error, not a
    silently different model."""
    from ovalp_flwr.finetune.flora import MERGED

    config = RunConfig.from_mapping({**app_config(), **BASE, "finetune": "flora",
                                     "drift-correction": "none"})
    built = setup_of(config)
    from flwr.app import ConfigRecord, RecordDict

    content = RecordDict({MERGED: ConfigRecord({"merged": 2})})
    with pytest.raises(RuntimeError, match="lost its state"):
        built.method.merge_pending(built.model, content, RecordDict())


def test_the_partitions_are_drawn_once_per_process(tmp_path, monkeypatch):
    """The server's summary, every node's describe, rows and test split share one draw per
    partition scheme and client count (it was drawn four times per node)."""
    calls = []
    original = finetune_client.partitions

    def counted(*args, **kwargs):
        calls.append(args[2])
        return original(*args, **kwargs)

    monkeypatch.setattr(finetune_client, "partitions", counted)
    finetune_client._SETUP.clear()
    run(tmp_path, finetune="lp", personalize="ft", **{"pft-epochs": 1})
    assert calls == [4]


def test_the_encoder_path_scores_every_domain(tmp_path):
    """On a multi-domain dataset the encoder path reports per-domain accuracy, as the cached
    path does."""
    summary, _, built = run(tmp_path, finetune="lp", dataset="concept:digits")
    names = built.data.domain_names
    assert len(names) > 1
    assert set(summary["domain_accuracy"]["final"]) == set(names)
    assert all(set(r["domain_accuracy"]) == set(names) for r in summary["rounds"])
