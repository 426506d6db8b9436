"""The proxy's own HTTP answers (egress/proxy/core/responses.py): a refusal names its reason
in the status line, in `Proxy-Status` and in a one-line body; `render_refusal` writes an
HTTP front-end's refusal, and nothing for one its front-end answers with a close
(docs/proxy.md#error-responses)."""

from __future__ import annotations

from dataclasses import replace

import pytest
from test_exchange import make_gate, request_intent

from egress.proxy.core.actions import Refuse
from egress.proxy.core.exchange import Exchange
from egress.proxy.core.intent import CLOSE, RESET, Answer, Front
from egress.proxy.core.responses import error_response, refusal_for, render_refusal
from egress.proxy.modes.kinds import HTTP


def head_and_body(data: bytes) -> tuple[list[str], bytes]:
    head, _, body = data.partition(b"\r\n\r\n")
    return head.decode("ascii").split("\r\n"), body


def test_a_refusal_names_its_reason_three_times() -> None:
    status, data = error_response("block_rule", 'blocked by rule "deny x"')
    lines, body = head_and_body(data)
    assert status == 403
    assert lines[0] == "HTTP/1.1 403 Forbidden (egress: block_rule)"
    assert (
        'Proxy-Status: egress; error=http_request_denied; details="blocked by rule \\"deny x\\""'
        in lines
    )
    assert body == b'egress: 403 block_rule: blocked by rule "deny x"\n'
    assert f"Content-Length: {len(body)}" in lines
    assert "Connection: close" in lines


def test_the_details_are_printable_ascii_whatever_the_name() -> None:
    """An agent-chosen name in the detail never reaches a header unescaped."""
    _, data = error_response("block_rule", "h\u00e9\r\nX-Evil: 1")
    lines, _ = head_and_body(data)
    assert not [line for line in lines if line.startswith("X-Evil")]
    assert any(
        line.endswith('details="h??\\?X-Evil: 1"') or 'details="h?' in line for line in lines
    )


def test_kept_alive_and_407_answers() -> None:
    _, kept = error_response("block_rule", "x", close=False)
    assert "Connection: close" not in head_and_body(kept)[0]
    status, auth = error_response("auth_required", "no credentials")
    assert status == 407
    assert 'Proxy-Authenticate: Basic realm="egress"' in head_and_body(auth)[0]


@pytest.mark.parametrize("code", ["no_such_reason", "allow_rule", "idle_timeout"])
def test_unknown_or_unanswered_reason_is_an_error_not_a_502(code: str) -> None:
    with pytest.raises(KeyError, match=code):
        refusal_for(code)
    with pytest.raises(KeyError):
        error_response(code, "x")


def test_overridden_status_keeps_the_error_type() -> None:
    assert refusal_for("bad_request", 505).status == 505
    status, data = error_response("bad_request", "HTTP/2", status=505)
    assert status == 505
    assert b"error=http_request_error" in data


def refused(front: Front) -> Refuse:
    """The gate's refusal of a request to a name the policy does not allow, on `front`."""
    gate = make_gate()
    action = Exchange(gate, front).start(request_intent(gate, "http://not-allowed.test/"))
    assert isinstance(action, Refuse)
    return action


def test_an_http_front_ends_refusal_is_its_error_response() -> None:
    action = refused(HTTP)
    verdict = action.verdict
    expected = error_response(verdict.reason, verdict.detail, status=action.answer.code)[1]
    assert render_refusal(action) == expected
    assert head_and_body(expected)[0][0].startswith(f"HTTP/1.1 {action.answer.code} ")
    kept = render_refusal(action, close=False)
    assert "Connection: close" not in head_and_body(kept)[0]


@pytest.mark.parametrize("answer", [CLOSE, RESET])
def test_a_refusal_answered_with_a_close_or_reset_writes_nothing(answer: Answer) -> None:
    """A tunnel refused after its `200`, a forwarder, a transparent tunnel: nothing is said."""
    assert render_refusal(replace(refused(HTTP), answer=answer)) == b""


def test_refusal_for_says_where_the_answers_are() -> None:
    with pytest.raises(KeyError, match=r"see egress\.reasons"):
        refusal_for("no_such_reason")
