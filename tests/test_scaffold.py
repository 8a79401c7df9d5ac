"""SCAFFOLD's variates kept by the server or by the clients (`scaffold-variates`): the same
corrections and the same global model, bit for bit, through sampling, lost replies, refused
replies, a stage change and a resume."""

import numpy as np
from flwr.app import ConfigRecord, Context, Message, MetricRecord, RecordDict

import client_app
from ovalp_flwr.config import RunConfig
from ovalp_flwr.federation import protocol as p
from ovalp_flwr.federation.local_grid import InProcessGrid, app_config
from ovalp_flwr.federation.results import read_summary
from ovalp_flwr.federation.scaffold import ControlVariates, HeldVariate
from ovalp_flwr.federation.scaffold_client import drift_offset, reply_variate
from server_app import run_server
from test_strategy import make_grid, requests, strategy_for  # tests/ is on sys.path

LR = 0.05


def node_context(node: int) -> Context:
    return Context(run_id=1, node_id=node, node_config={}, state=RecordDict(), run_config={})


def client_reply(message: Message, context: Context, config: RunConfig,
                 local: dict[str, np.ndarray], steps: int, examples: int) -> tuple[Message, dict]:
    """What a node's `train` sends back for `local` (its trained heads): the ClientApp's own
    SCAFFOLD half, without the training."""
    offset = drift_offset(message, context)
    content = RecordDict({p.ARRAYS: p.to_record(local), p.METRICS: MetricRecord({
        p.NUM_EXAMPLES: examples, p.TRAIN_LOSS: 0.1, p.TRAIN_SECONDS: 0.01, p.LOCAL_STEPS: steps})})
    variate = reply_variate(config.rounds, config.learning_rate, context, message, local, steps,
                            offset)
    if variate is not None:
        content[p.VARIATE] = variate
    return Message(content=content, reply_to=message), offset


def federate(mode: str, rounds: int = 7) -> tuple[list, list, dict]:
    """Rounds of a sampled federation of 8 nodes with a stage change after round 2, a reply lost
    in round 3 (the node trained, the server never heard) and one refused in round 4 (NaN):
    the global arrays and the offsets each node trained with, round by round, and what kinds
    of correction went out."""
    config = RunConfig(stage1_rounds=2, learning_rate=LR, scaffold_variates=mode)
    strategy = strategy_for(config, control_variates=ControlVariates(
        LR, held_by_clients=mode == "clients"), fraction_train=0.75)
    grid = make_grid(8)
    contexts = {node: node_context(node) for node in grid.get_node_ids()}
    rng = np.random.default_rng(5)
    global_arrays = {"weight": np.zeros((2, 3), np.float32), "bias": np.zeros(2, np.float32)}
    history, offsets, kinds = [], [], {"shared": 0, "correction": 0}
    for server_round in range(1, rounds + 1):
        sent = list(strategy.configure_train(server_round, p.to_record(global_arrays),
                                             ConfigRecord(), grid))
        kinds["shared"] += sum(p.SHARED_VARIATE in m.content for m in sent)
        kinds["correction"] += sum(p.CORRECTION in m.content for m in sent)
        replies = []
        for i, message in enumerate(sent):
            node = message.metadata.dst_node_id
            local = {key: value + rng.standard_normal(value.shape).astype(np.float32)
                     for key, value in global_arrays.items()}
            if (server_round, i) == (4, 1):
                local["weight"][0, 0] = np.nan
            reply, offset = client_reply(message, contexts[node], config, local,
                                         steps=1 + (server_round + i) % 3, examples=10 + i)
            offsets.append((server_round, node, offset))
            if (server_round, i) != (3, 0):  # lost: the node has trained, the server never hears
                replies.append(reply)
        arrays, _ = strategy.aggregate_train(server_round, replies)
        global_arrays = {key: array.numpy() for key, array in arrays.items()}
        history.append(global_arrays)
    return history, offsets, kinds


def same(a, b) -> bool:
    if isinstance(a, dict) or isinstance(b, dict):
        return (isinstance(a, dict) and isinstance(b, dict) and a.keys() == b.keys()
                and all(np.array_equal(a[key], b[key]) for key in a))
    return a is None and b is None


def test_clients_that_keep_their_variates_give_the_server_modes_model_bit_for_bit():
    server_history, server_offsets, server_kinds = federate("server")
    clients_history, clients_offsets, clients_kinds = federate("clients")
    assert all(same(a, b) for a, b in zip(server_history, clients_history, strict=True))
    assert [(r, n) for r, n, _ in server_offsets] == [(r, n) for r, n, _ in clients_offsets]
    assert all(same(a, b) for (_, _, a), (_, _, b) in zip(server_offsets, clients_offsets))
    assert any(offset is not None for _, _, offset in clients_offsets)
    # the server sends c to the nodes that hold their c_i, and c - c_i to the rest: new in
    # the stage, lost in round 3, refused in round 4
    assert server_kinds["shared"] == 0 and clients_kinds["shared"] > 0
    assert 0 < clients_kinds["correction"] < server_kinds["correction"]


def test_a_node_holds_its_variate_only_while_its_last_reply_was_taken():
    config = RunConfig(schedule="single-stage", learning_rate=LR, scaffold_variates="clients")
    variates = ControlVariates(LR, held_by_clients=True)
    strategy, sent = requests(3, strategy_for(config, control_variates=variates), start=1.0)
    contexts = {m.metadata.dst_node_id: node_context(m.metadata.dst_node_id) for m in sent}
    local = {"weight": np.full((2, 3), 0.5, np.float32)}
    replies = [client_reply(m, contexts[m.metadata.dst_node_id], config, local, 2, 5)[0]
               for m in sent]
    del replies[2].content[p.VARIATE]  # a client that does not keep its own
    strategy.aggregate_train(1, replies)
    assert strategy.rounds[1]["rejections"][0]["reason"] == (
        "the reply lacks its 'variate' record (scaffold-variates = \"clients\")")
    nodes = [m.metadata.dst_node_id for m in sent]
    assert variates.held == {nodes[0]: 1, nodes[1]: 1}
    corrections = variates.corrections(2, nodes)
    assert corrections[nodes[0]] == HeldVariate(1) and corrections[nodes[1]] == HeldVariate(1)
    assert isinstance(corrections[nodes[2]], dict)  # refused: never reported, sent c itself
    assert variates.held == {}  # each holds it until its reply to round 2 is taken
    # a resumed run's nodes hold nothing: every one is sent c - c_i
    restored = ControlVariates(LR, held_by_clients=True)
    restored.restore(*variates.state(lambda node: node), node_of=lambda pid: pid)
    assert all(isinstance(c, dict) for c in restored.corrections(2, nodes).values())
    # a new stage starts afresh
    assert variates.corrections(3, nodes) == {} and variates.held == {}


def test_a_non_finite_variate_refuses_its_reply_before_the_average():
    config = RunConfig(schedule="single-stage", learning_rate=LR, scaffold_variates="clients")
    strategy, sent = requests(2, strategy_for(config, control_variates=ControlVariates(
        LR, held_by_clients=True)), start=1.0)
    replies = [client_reply(m, node_context(m.metadata.dst_node_id), config,
                            {"weight": np.full((2, 3), value, np.float32)}, 1, 5)[0]
               for m, value in zip(sent, (0.5, 3.0))]
    replies[1].content[p.VARIATE] = p.to_record({"weight": np.full((2, 3), np.inf, np.float32)})
    arrays, _ = strategy.aggregate_train(1, replies)
    assert np.all(arrays["weight"].numpy() == 0.5)  # only the first reply averaged
    assert strategy.rounds[1]["rejections"] == [{
        "node": sent[1].metadata.dst_node_id, "reason": "variate 'weight' has 6 non-finite value(s)"}]


def test_the_run_is_the_same_whichever_side_keeps_the_variates(cache_dir, tmp_path):
    """The real ClientApp, in process, sampled: the same rounds and the same final model."""
    from ovalp_flwr.federation.checkpoint import read_checkpoint, unpack

    runs = {}
    for mode in ("server", "clients"):
        run_config = {**app_config(), "encoder": "pixels", "feature-cache-dir": str(cache_dir),
                      "results-dir": str(tmp_path), "num-server-rounds": 5, "run-name": mode,
                      "partition": "shard", "fraction-train": 0.5, "scaffold-variates": mode}
        grid = InProcessGrid(client_app.app, 6, run_config)
        summary = read_summary(run_server(grid, RunConfig.from_mapping(run_config)))
        final = unpack("global", read_checkpoint(tmp_path / mode).arrays)
        runs[mode] = summary, final
    (server, server_final), (clients, clients_final) = runs["server"], runs["clients"]
    same_keys = ("accuracy", "train_loss", "clients_trained")
    assert [[r[k] for k in same_keys] for r in server["rounds"]] == \
        [[r[k] for k in same_keys] for r in clients["rounds"]]
    assert same(server_final, clients_final)
    # the upload carries c_i beside the heads; the download is c instead of c - c_i
    received = [r["bytes_received_per_client"] for r in clients["rounds"]]
    assert all(c > 1.9 * s for c, s in zip(received, [r["bytes_received_per_client"]
                                                      for r in server["rounds"]]))
