"""The stand-in Ray cluster's commands (its run on two raylets: tests/test_launch.py, e2e)."""

import pytest

from ovalp_flwr.ops.ray_cluster import local_cluster, node_command


def flags(command: list[str]) -> dict[str, str]:
    return {arg: command[i + 1] for i, arg in enumerate(command[:-1]) if arg.startswith("--")}


def test_head_and_raylet_commands_block_and_take_ports_of_their_own(tmp_path):
    head = node_command(tmp_path, 1, 6379)
    raylet = node_command(tmp_path, 2, None)
    assert head[1:3] == ["start", "--block"] and raylet[1:3] == ["start", "--block"]
    assert "--head" in head and "--head" not in raylet
    assert flags(head)["--port"] == "6379" and flags(head)["--temp-dir"] == str(tmp_path)
    assert flags(raylet)["--num-cpus"] == "2"
    ports = [flags(c)[k] for c in (head, raylet) for k in flags(c) if k.endswith("-port")]
    assert len(ports) == len(set(ports))  # two raylets on one machine must not collide


def test_a_cluster_of_no_nodes_is_refused():
    with pytest.raises(ValueError, match="nodes=0, cpus_per_node=1 are not allowed"):
        with local_cluster(0):
            pass
