"""Free loopback ports (`ops.ports`)."""

import socket

from ovalp_flwr.ops.ports import free_port, free_ports


def test_free_ports_are_distinct_and_bindable():
    ports = free_ports(64)
    assert len(set(ports)) == 64
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", free_port()))
