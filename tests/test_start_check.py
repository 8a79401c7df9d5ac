"""The start check's verdict (`ova.start_check`): the forgers found are mended unless that
costs, and left out only where that clearly beats keeping or mending them. The whole check, run
end to end, is in tests/test_leave_out.py and tests/test_holdout.py."""

from ovalp_flwr.ova.start_check import screen_verdict


def test_the_screen_mends_unless_that_costs_and_leaves_out_only_what_clearly_helps():
    margin = 0.005
    assert screen_verdict({}, margin) is None
    assert screen_verdict({"out": 0.004}, margin) is None  # too little for their rows
    assert screen_verdict({"out": 0.006}, margin) == "out"
    assert screen_verdict({"out": 0.0, "repaired": -0.004}, margin) == "repaired"  # their word
    assert screen_verdict({"out": 0.0, "repaired": -0.5}, margin) is None  # mending costs
    assert screen_verdict({"out": 0.006, "repaired": 0.002}, margin) == "repaired"
    assert screen_verdict({"out": 0.009, "repaired": 0.002}, margin) == "out"
