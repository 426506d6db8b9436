"""`net.accept.accept`: the proxy's accept gives a socket that reads as the stdlib's would
(family, type, peer, data), with its family and type read once per listener (real loopback
sockets, no root)."""

from __future__ import annotations

import socket

import pytest

from egress.proxy.net.accept import Accepted, accept


def test_accepted_reads_as_the_stdlib_socket() -> None:
    host, family = "127.0.0.1", socket.AF_INET
    listener = socket.socket(family, socket.SOCK_STREAM)
    listener.bind((host, 0))
    with listener:
        listener.listen(4)
        listener.setblocking(False)
        port = listener.getsockname()[1]
        with (
            socket.create_connection((host, port), timeout=5) as a,
            socket.create_connection((host, port), timeout=5) as b,
        ):
            listener.setblocking(True)
            plain, plain_addr = listener.accept()
            ours, addr = accept(listener, listener.family, listener.type)
            with plain, ours:
                assert isinstance(ours, Accepted)
                assert (ours.family, ours.type) == (plain.family, plain.type)
                assert (ours.family, ours.type) == (family, socket.SOCK_STREAM)
                assert {addr, plain_addr} == {a.getsockname(), b.getsockname()}
                assert ours.getpeername() == addr
                peer = a if a.getsockname() == addr else b
                peer.sendall(b"ping")
                assert ours.recv(4) == b"ping"
                assert "Accepted" in repr(ours)
            assert ours.fileno() == -1


def test_accept_on_an_empty_queue_raises_as_the_stdlib() -> None:
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(1)
        listener.setblocking(False)
        with pytest.raises(BlockingIOError):
            accept(listener, listener.family, listener.type)
