"""The clients' statistics summed under Flower's SecAgg+ (`statistics-aggregation = "secagg+"`).

A closed-form start needs only the *sum* of the clients' statistics, which is what secure
aggregation computes: with it the server learns the federation's sums and each client's
sample count, not one client's class sums or Gram matrix.

Flower 1.41 and 1.42 have SecAgg+ only in their legacy server API: `SecAggPlusWorkflow` type-checks for a
`LegacyContext`, asks a legacy `Strategy` whom to send fit instructions to, and hands the
aggregate to that strategy's `aggregate_fit`; its client half, `secaggplus_mod`, masks the
`fitres.parameters` of a legacy FitRes-shaped reply to a `train` message. The message-API
strategies this app runs on (`flwr.serverapp.strategy`) have no SecAgg+. This module bridges
the two for the one exchange that needs it: a `LegacyContext` whose strategy (`SumStatistics`)
sends every node the statistics request, answered by the ClientApp's mod
(`client.secure_statistics_mod`) with the statistics as FitRes parameters.

What SecAgg+ costs, as the workflow works:
- four exchanges instead of none (plain statistics ride on `set_norm`); each client uploads
  its masked vector (one int64 per statistic: twice float32's bytes) and key shares for its
  k - 1 neighbours (`secagg_sizing`: k a fifth of the clients, at least 7);
- precision: the workflow averages Σ n_i v_i / Σ n_i of each client's per-sample statistics
  v_i (`ClassStatistics.per_sample_vector`), each within ± the range `statistics_range`
  gives (`CLIPPING_RANGE`, or the rows' bound where it is known; a client whose statistics lie
  outside refuses instead of being clipped) and quantised to `quantization_range(...)`
  levels, so the sums come back exact to about 1e-5 of their scale instead of float32's 1e-7
  (`tests/test_secure_sum.py`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from flwr.app import ConfigRecord, Context, RecordDict
from flwr.common import FitIns, ndarrays_to_parameters, parameters_to_ndarrays
from flwr.compat.common import recorddict_compat as compat
from flwr.server.client_manager import SimpleClientManager
from flwr.server.compat.grid_client_proxy import GridClientProxy
from flwr.server.compat.legacy_context import LegacyContext
from flwr.server.strategy import Strategy
from flwr.server.workflow import SecAggPlusWorkflow
from flwr.server.workflow.constant import MAIN_CONFIGS_RECORD, MAIN_PARAMS_RECORD, Key
from flwr.serverapp import Grid

from ovalp_flwr.federation import protocol as p
from ovalp_flwr.core.head_init.statistics import ClassStatistics

# each client's secrets go to a share of the sum's clients (at least `FEWEST_SHARES`, all of them
# in a small sum), and a strict majority of those shares rebuilds them (`secagg_sizing`)
SHARE_FRACTION, FEWEST_SHARES = 0.2, 7
CLIPPING_RANGE = 1024.0  # |per-sample statistic| allowed; standardised features stay far below
MODULUS_RANGE = 2**32  # the largest Flower allows


def quantization_range(num_clients: int) -> int:
    """The most levels for which the sum of every client's quantised entries stays below the
    modulus (a power of two, as Flower asks)."""
    return 2 ** int(np.floor(np.log2(MODULUS_RANGE / (2 * max(num_clients, 2)))))


def statistics_range(row_norm: float | None, noise_std: float = 0.0) -> float:
    """The clipping range the per-sample statistics need: with every row's norm bounded
    (`feature-norm = "l2"`, or DP's clip), no per-sample entry exceeds max(1, bound²), plus,
    under distributed DP, eight standard deviations of a one-row client's noise share; SecAgg+
    quantises over this range, so a tight one keeps the sums exact (l2 features' per-sample
    Gram entries are about 1/D: over ±1024 their quantisation error was as large as they are).
    Unbounded rows: `CLIPPING_RANGE`."""
    if row_norm is None:
        return CLIPPING_RANGE
    return max(1.0, row_norm ** 2) + 8.0 * noise_std


def secagg_sizing(clients: int) -> tuple[int, int]:
    """SecAgg+'s number of shares k and reconstruction threshold t for a sum over `clients`:
    k = max(⌈0.2·n⌉, 7) made odd, at most n, and t = ⌊k/2⌋ + 1, a strict majority, as Flower's
    guidance for SecAgg+ asks (shares a fraction of the clients, a threshold above half of
    them) instead of its example's fixed 3 / 2. What it buys: an honest-but-curious server
    must collude with t of a client's k share holders to rebuild both its self-mask and its
    mask key, so any t − 1 colluding clients learn nothing of an honest client's vector; a
    client that drops out is unmasked from any t of its k − 1 neighbours, so fewer than half
    of them may go too."""
    shares = min(clients, max(math.ceil(SHARE_FRACTION * clients), FEWEST_SHARES))
    if shares < clients and shares % 2 == 0:
        shares += 1
    return shares, shares // 2 + 1


def fewest_survivors(holders: int, dropouts: float) -> int:
    """How many of `holders` clients holding data a secure sum needs back when a share
    `dropouts` of them may drop out (`secagg-dropouts`); at least one."""
    return max(holders - math.floor(dropouts * holders + 1e-9), 1)


def secure_statistics(grid: Grid, nodes: list[int], request: dict, sizes: dict[int, int],
                      num_features: int, clipping_range: float = CLIPPING_RANGE,
                      fewest: int | None = None) -> tuple[ClassStatistics, set[int]] | None:
    """Every node's statistics summed under SecAgg+, and the nodes whose statistics are in the
    sum: the server sees the sum and each node's sample count (`sizes`, from `describe`),
    nothing else of them. With `fewest`, a sum that SecAgg+ completed without some nodes is
    kept when at least that many nodes holding data are in it (their counts make its total);
    without, every node must be. None if the protocol halted or too few came back (their
    errors are in the grid's replies)."""
    average = secure_average(grid, nodes, request, sizes, clipping_range=clipping_range)
    if average is None:
        return None
    holders = {node for node in nodes if sizes[node]}
    if len(holders & average.contributors) < (len(holders) if fewest is None else fewest) \
            or (fewest is None and average.contributors != set(nodes)):
        return None
    total = sum(sizes[node] for node in average.contributors)
    return ClassStatistics.from_per_sample_vector(
        average.vector, total, int(request[p.NUM_CLASSES]), num_features), average.contributors


@dataclass(frozen=True)
class SecureAverage:
    """What SecAgg+ showed the server: the sample-weighted mean of the nodes' vectors, and which
    nodes' vectors are in it."""

    vector: np.ndarray
    contributors: set[int]


def secure_average(grid: Grid, nodes: list[int], request: dict, sizes: dict[int, int],
                   arrays: list[np.ndarray] = (), *, clipping_range: float) -> SecureAverage | None:
    """The sample-weighted mean of one vector per node (what a `train` message with `request`,
    and `arrays` as its legacy parameters, makes the node's `secure_statistics_mod` return),
    under SecAgg+; None if the protocol halted."""
    manager = SimpleClientManager()
    for node in nodes:  # the workflow only reads their node ids (run id 0: never used)
        manager.register(GridClientProxy(node, grid, 0))
    strategy = SumStatistics({**request, p.CLIPPING_RANGE: clipping_range})
    context = LegacyContext(Context(run_id=0, node_id=0, node_config={}, state=RecordDict(),
                                    run_config={}), strategy=strategy, client_manager=manager)
    context.state.config_records[MAIN_CONFIGS_RECORD] = ConfigRecord({Key.CURRENT_ROUND: 0})
    context.state.array_records[MAIN_PARAMS_RECORD] = compat.parameters_to_arrayrecord(
        ndarrays_to_parameters(list(arrays)), keep_input=True)
    shares, threshold = secagg_sizing(len(nodes))
    SecAggPlusWorkflow(
        shares if shares > 2 else 1.0, threshold,  # Flower takes 2 shares only as "all" (1.0)
        max_weight=float(max(max(sizes.values()), 1)), clipping_range=clipping_range,
        quantization_range=quantization_range(len(nodes)), modulus_range=MODULUS_RANGE,
    )(grid, context)
    if strategy.average is None:
        return None
    return SecureAverage(strategy.average, strategy.contributors)


class SumStatistics(Strategy):
    """The legacy strategy SecAgg+ talks to: every node gets the statistics request, and the
    aggregate it is handed (every FitRes carries the same unmasked average) is kept."""

    def __init__(self, request: dict) -> None:
        self.request = dict(request)
        self.average: np.ndarray | None = None
        self.contributors: set[int] = set()

    def initialize_parameters(self, client_manager):
        return None

    def configure_fit(self, server_round, parameters, client_manager):
        return [(proxy, FitIns(parameters, dict(self.request)))
                for proxy in client_manager.all().values()]

    def aggregate_fit(self, server_round, results, failures):
        if results:
            (self.average,) = parameters_to_ndarrays(results[0][1].parameters)
            self.contributors = {int(proxy.node_id) for proxy, _ in results}
        return None, {}

    def configure_evaluate(self, server_round, parameters, client_manager):
        return []

    def aggregate_evaluate(self, server_round, results, failures):
        return None, {}

    def evaluate(self, server_round, parameters):
        return None
