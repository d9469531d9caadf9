"""engine/traces/asgi.py: the socket the gateway and collect serve on."""

from __future__ import annotations

import socket

import pytest

from engine.traces import TraceError
from engine.traces.asgi import bound_socket


def test_the_listening_socket_names_tcp_so_asyncio_turns_nagle_off():
    # asyncio sets TCP_NODELAY only on sockets whose proto is IPPROTO_TCP; with Nagle's
    # algorithm on, each small reply waited 40 ms for the client's delayed ACK
    sock = bound_socket("127.0.0.1", 0)
    try:
        assert sock.proto == socket.IPPROTO_TCP
        client = socket.create_connection(sock.getsockname()[:2])
        accepted, _ = sock.accept()
        assert accepted.proto == socket.IPPROTO_TCP
        accepted.close()
        client.close()
    finally:
        sock.close()


def test_a_port_in_use_is_one_line():
    taken = bound_socket("127.0.0.1", 0)
    try:
        with pytest.raises(TraceError, match="the port is in use"):
            bound_socket("127.0.0.1", taken.getsockname()[1])
    finally:
        taken.close()
