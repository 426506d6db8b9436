"""Public suffixes (egress/policy/psl.py), from tldextract's bundled snapshot: never fetched
(docs/policy.md#lint)."""

from __future__ import annotations

import socket

import pytest

from egress.policy import psl
from egress.policy.psl import is_public_suffix


@pytest.mark.parametrize("name", ["com", "org", "co.uk", "xn--p1ai"])
def test_public_suffixes(name: str) -> None:
    assert is_public_suffix(name)


# the list's ICANN section only: `github.io` is in its private section, so `*.github.io` is a
# rule about one company's names, not a whole suffix
@pytest.mark.parametrize("name", ["example.com", "bbc.co.uk", "github.io", "x.github.io"])
def test_registrable_names_are_not(name: str) -> None:
    assert not is_public_suffix(name)


def test_the_list_is_read_without_the_network(monkeypatch: pytest.MonkeyPatch) -> None:
    """The snapshot inside the wheel: a lookup that tried to fetch the list would fail here."""

    def no_network(*args: object, **kwargs: object) -> socket.socket:
        raise AssertionError("the public suffix list was fetched")

    monkeypatch.setattr(socket, "socket", no_network)
    monkeypatch.setattr(socket, "create_connection", no_network)
    psl._extractor.cache_clear()  # built afresh, as at a proxy's first lint
    try:
        assert is_public_suffix("co.uk")
    finally:
        psl._extractor.cache_clear()
