"""FLoRA (Wang et al., 2024): stacking, not averaging, the clients' LoRA modules.

FedAvg-LoRA's global update is (sum p_k B_k)(sum p_k A_k), which is not what any client
learned: the cross terms B_j A_k are noise. FLoRA stacks the modules instead, A = [A_1; ...;
A_n] and B = [p_1 B_1, ..., p_n B_n], so B A = sum p_k B_k A_k exactly; every client merges
that update into its copy of the encoder and starts fresh LoRA modules the next round.

Here the server keeps every round's stack and sends each node, with its train message, the
stacks of the rounds it has not merged yet (after a round it sat out, several); the node
keeps the sum of the merged updates in its `context.state` (Flower keeps a node's state for
the run). The heads are averaged with FedAvg. The download grows with the clients that
trained last round (sum of their ranks); the README's bytes per round show it.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np
import torch
from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict
from flwr.serverapp.strategy import FedAvg

from ovalp_flwr.finetune.lora import FedAvgLoRA, delta_weight
from ovalp_flwr.finetune.model import EncoderClassifier
from ovalp_flwr.federation.protocol import from_record, to_record
from ovalp_flwr.federation.replies import TrainReply
from ovalp_flwr.federation.scaffold import Correction
from ovalp_flwr.federation.strategy import Staged

STACKS = "flora-stacks"  # the train message's record of "<round>/<layer>/A|B" stacks to merge
STATE_DELTA = "flora-delta"  # a node's merged update so far, by base weight name
STATE_ROUND = "flora-round"  # ... and the last round merged into it
MERGED = "flora"  # the train message's config: {"merged": the round the server knows merged}


class FLoRA(FedAvgLoRA):
    name = "flora"

    def prepare(self, model: EncoderClassifier) -> EncoderClassifier:
        super().prepare(model)
        self.pristine = {f"{name}.base_layer.weight": layer.base_layer.weight.detach().clone()
                         for name, layer in self.lora_layers(model).items()}
        return model

    def stack(self, replies: list[tuple[dict[str, np.ndarray], float]]) -> dict[str, np.ndarray]:
        """One round's stacks from (arrays, weight) of the clients that trained: per LoRA layer,
        A = the A_k one under another, B = the p_k B_k side by side (p_k: normalised weights)."""
        total = sum(weight for _, weight in replies)
        layers = sorted({key.rsplit(".lora_A.", 1)[0] for key in replies[0][0] if ".lora_A." in key})
        out = {}
        for layer in layers:
            a_key, b_key = f"{layer}.lora_A.default.weight", f"{layer}.lora_B.default.weight"
            out[f"{layer}/A"] = np.concatenate([arrays[a_key] for arrays, _ in replies], axis=0)
            out[f"{layer}/B"] = np.concatenate([arrays[b_key] * np.float32(weight / total)
                                                for arrays, weight in replies], axis=1)
        return out

    def merged(self, delta: dict[str, np.ndarray], stacks: dict[str, np.ndarray]
               ) -> dict[str, np.ndarray]:
        """`delta` plus the update the stacks describe (B A x alpha / rank), by base weight name."""
        out = dict(delta)
        for key in stacks:
            if not key.endswith("/A"):
                continue
            layer = key[:-2]
            update = delta_weight(torch.from_numpy(stacks[key]), torch.from_numpy(stacks[f"{layer}/B"]),
                                  self.options.scaling).numpy()
            name = f"{layer}.base_layer.weight"
            out[name] = update if name not in out else out[name] + update
        return out

    def apply(self, model: EncoderClassifier, delta: dict[str, np.ndarray]) -> None:
        """The encoder = the pretrained weights plus the merged update (never accumulated in
        place: a float sum redone from the same parts is the same on every node)."""
        state = dict(model.named_parameters())
        with torch.no_grad():
            for name, pristine in self.pristine.items():
                weight = state[name]
                weight.copy_(pristine)
                if name in delta:
                    weight.add_(torch.as_tensor(delta[name], device=weight.device))

    def merge_pending(self, model: EncoderClassifier, content: RecordDict, node_state: RecordDict,
                      ) -> dict[str, ArrayRecord | ConfigRecord]:
        """A node's side: merge the stacks of the rounds it has not merged yet, and load
        pristine + merged update into the encoder. Returns the node's new state records, for
        the caller to keep once the round succeeded (a failed round leaves the state as it
        was, as the server assumes)."""
        delta = from_record(node_state[STATE_DELTA]) if STATE_DELTA in node_state else {}
        done = int(node_state[STATE_ROUND]["round"]) if STATE_ROUND in node_state else 0
        known = int(content[MERGED]["merged"]) if MERGED in content.config_records else done
        if done != known:  # a node that lost its state would train on another encoder
            raise RuntimeError(f"FLoRA: this node's encoder has the updates of rounds 1..{done} "
                               f"merged, the server sent it those of rounds 1..{known}: the "
                               "node lost its state (restarted?) and cannot rejoin this run")
        updates: dict[str, ArrayRecord | ConfigRecord] = {}
        if STACKS in content.array_records:
            by_round: dict[int, dict[str, np.ndarray]] = {}
            for key, value in from_record(content[STACKS]).items():
                round_text, rest = key.split("/", 1)
                by_round.setdefault(int(round_text), {})[rest] = value
            for server_round in sorted(r for r in by_round if r > done):
                delta = self.merged(delta, by_round[server_round])
                done = server_round
            updates = {STATE_DELTA: to_record(delta), STATE_ROUND: ConfigRecord({"round": done})}
        self.apply(model, delta)
        return updates


class StagedFLoRA(Staged, FedAvg):
    """The run's strategy under `finetune = "flora"`: Staged's sampling, screening and costs;
    FedAvg for the heads, the LoRA modules stacked into the round's update, then restarted."""

    def __init__(self, *, flora: FLoRA, fresh: dict[str, np.ndarray], **options) -> None:
        self.flora, self.fresh = flora, fresh
        self.stacks: dict[int, dict[str, np.ndarray]] = {}  # round -> its stack
        self.delta: dict[str, np.ndarray] = {}  # the merged update (the server's model)
        self.merged_by: dict[int, int] = {}  # node -> the last round whose stack it was sent
        super().__init__(**options)

    def _train_message(self, content: RecordDict, node_id: int, correction: Correction | None,
                       shared: ArrayRecord | None = None) -> Message:
        pending = {f"{r}/{key}": value for r, stack in self.stacks.items()
                   if r > self.merged_by.get(node_id, 0) for key, value in stack.items()}
        extra = {MERGED: ConfigRecord({"merged": self.merged_by.get(node_id, 0)})}
        if pending:
            extra[STACKS] = to_record(pending)
        return super()._train_message(RecordDict({**content, **extra}), node_id, correction,
                                      shared)

    def aggregate_train(self, server_round: int, replies: Iterable[Message]
                        ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """A node that answered has merged every stack it was sent (up to last round's)."""
        replies = list(replies)
        for message in replies:
            if not message.has_error():
                self.merged_by[message.metadata.src_node_id] = server_round - 1
        return super().aggregate_train(server_round, replies)

    def _combine(self, server_round: int, trained: list[TrainReply],
                 mean: dict[str, np.ndarray]) -> tuple[ArrayRecord, MetricRecord]:
        """The mean (the heads' FedAvg); the LoRA modules' stack kept, the modules restarted."""
        arrays, metrics = super()._combine(server_round, trained, mean)
        stack = self.flora.stack([(reply.arrays, float(reply.weight)) for reply in trained])
        self.stacks[server_round] = stack
        self.delta = self.flora.merged(self.delta, stack)
        restarted = {key: self.fresh.get(key, value.numpy()) for key, value in arrays.items()}
        return to_record(restarted), metrics
