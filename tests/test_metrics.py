"""R(t), Acc@95 and costs, on hand-made summaries whose answers are known."""

import math

import pytest

from ovalp_flwr.federation.metrics import (acc_at, accuracy_curve, bytes_through, cost_to_round,
                                first_round_at, relative_curve, start_and_rounds)


def summary(curve, **fields):
    return {"rounds": [{"round": t, "accuracy": a, **fields} for t, a in enumerate(curve, 1)]}


def test_relative_curve_is_percent_of_iid_round_by_round():
    assert relative_curve([0.45, 0.9], [0.9, 0.9]) == [50.0, 100.0]
    assert math.isnan(relative_curve([0.1], [0.0])[0])
    with pytest.raises(ValueError, match="one length"):
        relative_curve([0.1], [0.1, 0.2])


def test_round_to_a_fixed_target_is_the_first_round_at_or_above_it_the_start_being_round_0():
    assert first_round_at([0.0, 0.1, 0.5, 0.6, 0.4], 0.6) == 3
    assert first_round_at([0.0, 0.7, 0.2], 0.6) == 1  # a later fall does not matter
    assert first_round_at([0.65, 0.7], 0.6) == 0  # a start already above the bar
    assert first_round_at([0.0, 0.1, 0.59], 0.6) is None  # never reached
    assert first_round_at([], 0.6) is None


def test_a_run_without_rounds_keeps_its_start_to_the_horizon():
    s = {**summary([]), "initial_accuracy": 0.6}
    assert start_and_rounds(s, 3) == [0.6, 0.6, 0.6, 0.6]
    s = {**summary([0.7, 0.8]), "initial_accuracy": 0.1}
    assert start_and_rounds(s) == [0.1, 0.7, 0.8] == start_and_rounds(s, 1)


def test_acc_at_95_is_the_first_round_reaching_95_percent_of_the_final_accuracy():
    assert acc_at([0.1, 0.5, 0.86, 0.9]) == 3  # 0.95 * 0.9 = 0.855
    assert acc_at([0.9, 0.95, 0.8]) == 1  # peaks early then falls: reached at once
    assert acc_at([0.2, 0.4, 0.6, 0.8]) == 4
    assert acc_at([]) is None


def test_cost_to_round_sums_time_and_bytes_both_ways():
    s = summary([0.1, 0.2, 0.3], client_train_seconds_mean=0.5, server_aggregate_seconds=0.1,
                server_eval_seconds=0.05, bytes_sent_per_client=100, clients_sampled=10,
                bytes_received_per_client=80, clients_trained=8)
    cost = cost_to_round(s, 2)
    assert cost["rounds"] == 2
    assert cost["client_seconds"] == pytest.approx(1.0)
    assert cost["server_seconds"] == pytest.approx(0.3)
    assert cost["bytes"] == 2 * (100 * 10 + 80 * 8)
    assert accuracy_curve(s) == [0.1, 0.2, 0.3]


def test_set_up_bytes_count_from_round_0_on():
    s = {**summary([0.1, 0.2], bytes_sent_per_client=100, clients_sampled=10,
                   bytes_received_per_client=80, clients_trained=8),
         "setup": {"bytes_sent": 500.0, "bytes_received": 7000.0}}
    assert bytes_through(s, 3) == [7500, 9140, 10780, 10780]
    assert cost_to_round(s, 1)["bytes"] == 9140
    assert bytes_through(summary([])) == [0.0]  # a summary from before set-up was recorded


def test_rounds_where_no_client_trained_cost_no_client_time():
    s = summary([0.1], client_train_seconds_mean=None, bytes_received_per_client=None,
                clients_trained=0, bytes_sent_per_client=10, clients_sampled=2)
    assert cost_to_round(s, 1)["client_seconds"] == 0 and cost_to_round(s, 1)["bytes"] == 20
