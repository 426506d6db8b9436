"""A rule as written into a `Rule` (egress/policy/grammar.py): the four forms, their
canonical spelling, the ports a rule speaks about, and errors that quote the rule
(docs/policy.md)."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from egress.errors import PolicyError
from egress.policy.grammar import parse_rule

LABEL = st.text(alphabet="abcxyz0123-", min_size=1, max_size=6).filter(
    lambda s: not s.startswith("-") and not s.endswith("-")
)
HOST = st.lists(LABEL, min_size=1, max_size=4).map(lambda ls: ".".join([*ls, "test"]))


BAD_RULES = [
    ("bracket", "a[bc].example.com", "'['"),
    ("slash-host", "evil.com/x", "CIDR"),
    ("bad-cidr", "10.0.0.1/8", "host bits"),
    ("scheme", "ftp://example.com", "scheme"),
    ("userinfo", "https://u@example.com", "userinfo"),
    ("port-zero", "example.com:0", "port"),
    ("port-big", "example.com:70000", "port"),
    ("port-text", "example.com:https", "port"),
    ("empty", "  ", "empty"),
    ("space", "exa mple.com", "letters"),
    ("empty-label", "*..example.com", "empty label"),
    ("numeric-tld", "example.999", "numeric"),
]


@pytest.mark.parametrize(
    ("rule", "needle"), [b[1:] for b in BAD_RULES], ids=[b[0] for b in BAD_RULES]
)
def test_bad_rule_quotes_the_rule(rule: str, needle: str) -> None:
    with pytest.raises(PolicyError) as info:
        parse_rule(rule, "allow")
    message = str(info.value)
    assert repr(rule.strip()) in message or repr(rule) in message
    assert needle in message


# (rule, action, scheme, port, covered?)
PORTS = [
    ("example.com", "allow", "https", 443, True),  # an allow rule's default ports
    ("example.com", "allow", "http", 80, True),
    ("example.com", "allow", "https", 22, False),
    ("example.com", "allow", "http", 443, False),
    ("example.com", "block", "https", 22, True),  # a block rule without a port: every port
    ("example.com:8443", "allow", "http", 8443, True),
    ("example.com:8443", "block", "https", 443, False),
    ("https://example.com", "allow", "https", 443, True),
    ("https://example.com", "allow", "http", 443, False),
    ("http://example.com:8080", "allow", "http", 8080, True),
    ("example.com:*", "allow", "https", 22, True),
    ("203.0.113.0/24:*", "allow", "http", 9000, True),
]


@pytest.mark.parametrize(("text", "action", "scheme", "port", "covered"), PORTS)
def test_the_ports_a_rule_speaks_about(
    text: str, action: str, scheme: str, port: int, covered: bool
) -> None:
    rule = parse_rule(text, action)  # type: ignore[arg-type]
    assert rule.covers_port(scheme, port) is covered  # type: ignore[arg-type]
    assert rule.text == text


def test_a_port_and_any_port_together_is_an_error() -> None:
    with pytest.raises(PolicyError, match="a port and ':\\*' together"):
        parse_rule("example.com:443:*", "allow")


@given(HOST, st.sampled_from(["*.", "", "https://", "http://"]))
def test_rule_normalization_is_idempotent(host: str, prefix: str) -> None:
    rule = parse_rule(prefix + host.upper() + ".", "allow")
    scheme = prefix if "://" in prefix else ""
    again = parse_rule(scheme + (rule.pattern or ""), "allow")
    assert again.pattern == rule.pattern
