"""Every front-end answers every `Reason`: the mode tables are complete, and agree with the
codecs they render through. Before this, SOCKS5's reply table named 9 reasons and every
other refusal quietly became "general failure"."""

from __future__ import annotations

import pytest

from egress.proxy.codec import socks5 as codec
from egress.proxy.core.intent import NEVER_REFUSED, Front
from egress.proxy.core.responses import REFUSALS
from egress.proxy.modes.kinds import (
    CONNECT,
    DNS,
    FORWARDER,
    HTTP,
    MODES,
    ROUTE,
    SOCKS5,
    SOCKS5_ANSWERS,
    TRANSPARENT,
    TRANSPARENT_HTTP,
    mode_for,
)
from egress.reasons import Reason

FRONTS = [HTTP, CONNECT, FORWARDER, SOCKS5, TRANSPARENT, TRANSPARENT_HTTP, DNS]


@pytest.mark.parametrize("front", FRONTS, ids=lambda f: f.name)
def test_every_reason_has_an_answer_in_every_mode(front: Front) -> None:
    missing = [r.value for r in Reason if r not in front.answers]
    assert not missing, f"{front.name} has no answer for {missing}"
    assert set(front.answers) == set(Reason)


def test_every_listener_mode_is_covered() -> None:
    fronts = {f.name for m in (*MODES.values(), ROUTE) for f in m.fronts}
    assert fronts == {f.name for f in FRONTS}


def test_socks5_table_keeps_the_codec_replies() -> None:
    """The nine reasons the codec's old table named keep their RFC 1928 reply; the table is
    explicit for the rest (no default)."""
    for code, reply in codec.REPLY_FOR_REASON.items():
        assert SOCKS5_ANSWERS[Reason(code)].code == reply, code
    assert all(a.style == "socks5" for a in SOCKS5_ANSWERS.values())


def test_http_answers_are_the_response_table() -> None:
    for reason in Reason:
        answer = HTTP.answer(reason)
        if reason.value in REFUSALS:
            assert (answer.style, answer.code) == ("http", REFUSALS[reason.value].status)
        else:
            assert answer.style == "close"


def test_transparent_tunnels_reset_every_refusal() -> None:
    for reason in Reason:
        expected = "close" if reason in NEVER_REFUSED else "reset"
        assert TRANSPARENT.answer(reason).style == expected


def test_listener_mode_is_chosen_once_per_kind() -> None:
    assert mode_for("http", forwarding=False).answers_at_accept
    assert mode_for("http", forwarding=True) is ROUTE
    for kind in ("socks5", "transparent", "dns"):
        mode = mode_for(kind, forwarding=False)
        assert not mode.answers_at_accept
        assert not mode.fast_path
    with pytest.raises(ValueError, match="unknown listener kind"):
        mode_for("gopher", forwarding=False)
