"""netcut's transparent mode against the real kernel: TCP and DNS redirected to listeners on
the sandbox's loopback (stand-ins for the proxy that report SO_ORIGINAL_DST), UDP other than
DNS still dropped, kept destinations untouched, and `restore` removing every redirect."""

from __future__ import annotations

import socket
import struct
import subprocess
import sys
import threading
from collections.abc import Iterator

import pytest
from netcut_testlib import Topology, ns_socket, sh, wait_for

import netcut
from netcut.plan.transparent import Redirect

pytestmark = pytest.mark.netns

LISTEN_PORT = 15001
DNS_PORT = 15053


def nat_rules(ns: str) -> list[str]:
    text = sh("ip", "netns", "exec", ns, "iptables-legacy-save", "-t", "nat",
              check=False).stdout  # fmt: skip
    return [x for x in text.splitlines() if "NETCUT" in x]


def netfilter(ns: str) -> list[str]:
    text = sh("ip", "netns", "exec", ns, "iptables-legacy-save", "-t", "filter").stdout
    return [x for x in text.splitlines() if x.startswith(("-", ":NETCUT"))]


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "netcut.cli", *args], capture_output=True,
                          text=True, timeout=60, check=False)  # fmt: skip


@pytest.fixture
def stand_ins(topo: Topology) -> Iterator[list[socket.socket]]:
    """On the sandbox's 127.0.0.1: a TCP listener answering `orig=ADDR:PORT` (what the proxy
    reads with SO_ORIGINAL_DST), and a UDP+TCP 'DNS' answering `dns:` + the query."""
    tcp = ns_socket(topo.sandbox)
    tcp.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    tcp.bind(("127.0.0.1", LISTEN_PORT))
    tcp.listen(16)
    udp = ns_socket(topo.sandbox, socket.AF_INET, socket.SOCK_DGRAM)
    udp.bind(("127.0.0.1", DNS_PORT))

    def accept() -> None:
        while True:
            try:
                conn, _ = tcp.accept()
            except OSError:
                return
            with conn:
                raw = conn.getsockopt(socket.SOL_IP, 80, 16)  # SO_ORIGINAL_DST
                port = struct.unpack("!H", raw[2:4])[0]
                conn.sendall(f"orig={socket.inet_ntoa(raw[4:8])}:{port}".encode())

    def answer() -> None:
        while True:
            try:
                data, peer = udp.recvfrom(512)
                if peer is None:  # shut down
                    return
                udp.sendto(b"dns:" + data, peer)
            except OSError:
                return

    for fn in (accept, answer):
        threading.Thread(target=fn, daemon=True).start()
    yield [tcp, udp]
    for s in (tcp, udp):
        try:
            s.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        s.close()


def talk(topo: Topology, addr: str, port: int) -> bytes:
    with topo.connect(addr, port, timeout=2.0) as sock:
        sock.sendall(b"ping")
        return sock.recv(64)


def test_transparent_cut_redirects_tcp_and_dns_and_restore_removes_it(
    topo: Topology, stand_ins: list[socket.socket]
) -> None:
    t = topo
    routes, rules = t.routes(), netfilter(t.sandbox)
    done = cli("cut", "--netns", t.sandbox, "--keep", t.proxy, "--transparent",
               "--redirect-to", str(LISTEN_PORT), "--dns-to", str(DNS_PORT))  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert f"redirect tcp to port {LISTEN_PORT}" in done.stdout

    # every TCP destination but the kept one reaches the stand-in, which sees the original
    assert talk(t, t.upstream_ip, t.echo_port) == f"orig={t.upstream_ip}:{t.echo_port}".encode()
    assert talk(t, "198.19.200.7", 443) == b"orig=198.19.200.7:443"  # no route before: now one
    assert talk(t, t.peer_ip, 22) == f"orig={t.peer_ip}:22".encode()
    assert talk(t, t.gateway, t.proxy_port) == b"ping", "the kept ADDR:PORT is not redirected"
    # DNS, whatever the server address, reaches the responder; TCP 53 too
    assert t.udp_reaches(t.gateway, 53) is False  # the stand-in answers dns:..., not an echo
    with ns_socket(t.sandbox, socket.AF_INET, socket.SOCK_DGRAM) as u:
        u.settimeout(2)
        u.sendto(b"q1", ("198.19.200.53", 53))
        assert u.recv(64) == b"dns:q1"
    # UDP other than DNS is still dropped
    assert not t.udp_reaches(t.upstream_ip, 7000)
    with ns_socket(t.sandbox, socket.AF_INET, socket.SOCK_DGRAM) as u:
        u.settimeout(0.5)
        with pytest.raises(PermissionError):  # the backstop rejects it in OUTPUT: EPERM
            u.sendto(b"x", ("198.19.200.7", 9999))
    status = netcut.status(t.sandbox)
    assert status.is_cut, status.lines()
    assert any("NETCUT_REDIRECT" in r for r in nat_rules(t.sandbox))

    again = netcut.cut(t.sandbox, [t.proxy], redirect=Redirect(LISTEN_PORT, DNS_PORT))
    assert not again.changed
    with pytest.raises(netcut.InvalidInput, match="already cut"):
        netcut.cut(t.sandbox, [t.proxy], redirect=Redirect(LISTEN_PORT + 1, DNS_PORT))
    with pytest.raises(netcut.InvalidInput, match="already cut"):
        netcut.cut(t.sandbox, [t.proxy])

    restored = netcut.restore(t.sandbox)
    assert restored.changed
    assert restored.status.state == "not cut"
    assert nat_rules(t.sandbox) == [], "every redirect is gone"
    assert netfilter(t.sandbox) == rules
    assert wait_for(lambda: t.routes() == routes), (routes, t.routes())
    assert t.reaches(t.upstream_ip, t.echo_port), "direct again, not redirected"
    assert netcut.status(t.sandbox).state == "not cut"


def test_transparent_marks_without_record_are_partial_and_restored(
    topo: Topology, stand_ins: list[socket.socket], tmp_path_factory: pytest.TempPathFactory
) -> None:
    import os

    netcut.cut(topo.sandbox, [topo.proxy], redirect=Redirect(LISTEN_PORT))
    for f in os.scandir(os.environ["NETCUT_STATE_DIR"]):  # lose the record
        os.unlink(f.path)
    status = netcut.status(topo.sandbox)
    assert status.state == "partial"
    assert "redirects" in status.details
    netcut.restore(topo.sandbox)
    assert nat_rules(topo.sandbox) == []
    assert netcut.status(topo.sandbox).state == "not cut"


def test_transparent_usage_errors() -> None:
    done = cli("cut", "--netns", "x", "--transparent")
    assert done.returncode == 2
    assert "--redirect-to" in done.stderr
    done = cli("cut", "--netns", "x", "--redirect-to", "5")
    assert done.returncode == 2
    # helper mode writes redirects too (tests/engines/test_helper_listeners_engines.py), for a
    # container only
    done = cli("cut", "--netns", "x", "--transparent", "--redirect-to", "5", "--mode", "helper")
    assert done.returncode == 2
    assert "helper mode needs --container" in done.stderr
    with pytest.raises(netcut.InvalidInput, match="expect-blocked"):
        netcut.cut("x", expect_blocked=["198.19.0.9:80"], redirect=Redirect(5))
