"""Evaluator-over-task composition and the Harbor / verifiers mappings."""

import fnmatch
import ipaddress
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from egress.errors import PolicyError, TargetError
from egress.policy.compose import compose, from_harbor, from_verifiers
from egress.policy.rules import Policy
from egress.policy.target import make_target


def allowed(policy: Policy, host: str, port: int = 443, scheme: str = "https") -> bool:
    return policy.decide(make_target(scheme, host, port)).allowed  # type: ignore[arg-type]


EVALUATOR = Policy(
    allow=["pypi.org", "*.pythonhosted.org", "*.github.com"],
    block=["evil.example"],
    default="deny",
    framework_routes=["http://127.0.0.1:8080"],
)

# (id, task policy, host, expected)
CASES = [
    ("evaluator-allow-remains-under-no-network", Policy(default="deny"), "pypi.org", True),
    ("public-task-cannot-widen", Policy(default="allow"), "example.com", False),
    ("task-allow-outside-evaluator-dropped", Policy(allow=["example.com"]), "example.com", False),
    ("task-allow-inside-evaluator-kept", Policy(allow=["api.github.com"]), "api.github.com", True),
    ("task-narrower-wildcard-kept", Policy(allow=["*.api.github.com"]), "x.api.github.com", True),
    ("task-wider-wildcard-dropped", Policy(allow=["*.com"]), "example.com", False),
    ("task-block-applies", Policy(block=["pypi.org"]), "pypi.org", False),
    (
        "evaluator-block-wins-over-task-allow",
        Policy(allow=["evil.example"], default="allow"),
        "evil.example",
        False,
    ),
]


@pytest.mark.parametrize(
    ("task", "host", "want"), [c[1:] for c in CASES], ids=[c[0] for c in CASES]
)
def test_compose_restricted_evaluator(task: Policy, host: str, want: bool) -> None:
    assert allowed(compose(EVALUATOR, task), host) is want


def test_framework_routes_remain() -> None:
    merged = compose(EVALUATOR, Policy(default="deny"))
    assert merged.decide(make_target("http", "127.0.0.1", 8080)).reason == "framework_route"


def test_permissive_evaluator_takes_task_restrictions() -> None:
    evaluator = Policy(default="allow", block=["evil.example"], allow=["pypi.org"])
    task = Policy(default="deny", allow=["example.com"])
    merged = compose(evaluator, task)
    assert merged.default == "deny"
    assert allowed(merged, "example.com")
    assert allowed(merged, "pypi.org")  # the evaluator's allow entries remain
    assert not allowed(merged, "other.com")
    assert not allowed(compose(evaluator, Policy(default="allow")), "evil.example")
    assert allowed(compose(evaluator, Policy(default="allow")), "other.com", 22)


def test_task_port_rule_needs_evaluator_port() -> None:
    assert not allowed(compose(EVALUATOR, Policy(allow=["pypi.org:22"])), "pypi.org", 22)


HARBOR = [
    ("public", {"network_mode": "public"}, "example.com", True),
    ("no-network", {"network_mode": "no-network"}, "example.com", False),
    (
        "allowlist-in",
        {"network_mode": "allowlist", "allowed_hosts": ["example.com"]},
        "example.com",
        True,
    ),
    (
        "allowlist-out",
        {"network_mode": "allowlist", "allowed_hosts": ["example.com"]},
        "other.com",
        False,
    ),
    ("unset-is-public", {}, "example.com", True),
]
ALLOWLIST = {
    "network_mode": "allowlist",
    "allowed_hosts": ["Example.COM.", "*.pythonhosted.org", "198.18.7.0/24", "2001:db8::1"],
}
# Harbor's sidecar redirects every TCP port, and its `*.` is a glob on the name
# (before: allowed_hosts covered ports 80/443 only, and `*.x` the apex `x` too)
HARBOR_PORTS = [
    ("name-443", "example.com", 443, True),
    ("name-any-port", "example.com", 22, True),
    ("name-plain-http-8080", "example.com", 8080, True),
    ("wildcard-sub-any-port", "files.pythonhosted.org", 8443, True),
    ("wildcard-deep", "a.b.pythonhosted.org", 443, True),
    ("wildcard-not-apex", "pythonhosted.org", 443, False),
    ("cidr-any-port", "198.18.7.9", 5432, True),
    ("cidr-outside", "198.18.8.9", 443, False),
    ("ipv6-any-port", "2001:db8::1", 22, True),
    ("other-name", "example.org", 443, False),
]


@pytest.mark.parametrize(
    ("task", "host", "want"), [c[1:] for c in HARBOR], ids=[c[0] for c in HARBOR]
)
def test_harbor_mapping(task: dict[str, object], host: str, want: bool) -> None:
    assert allowed(from_harbor(task), host) is want


@pytest.mark.parametrize(
    ("host", "port", "want"), [c[1:] for c in HARBOR_PORTS], ids=[c[0] for c in HARBOR_PORTS]
)
def test_harbor_allowlist_every_port(host: str, port: int, want: bool) -> None:
    policy = from_harbor(ALLOWLIST)
    assert allowed(policy, host, port, "https") is want
    assert allowed(policy, host, port, "http") is want


@pytest.mark.parametrize(
    "entry",
    ["1.2.3", "2130706433", "::ffff:10.0.0.1", "::ffff:0:0/96", "xn--zz.test", "*.a.123"],
)
def test_harbor_entries_we_cannot_express_are_refused(entry: str) -> None:
    with pytest.raises(PolicyError, match="cannot be expressed exactly"):
        from_harbor({"network_mode": "allowlist", "allowed_hosts": [entry]})


@pytest.mark.parametrize(
    "entry",
    ["https://a.test", "a.test:443", "*", "a*.test", "*.10.0.0.1", "10.0.0.1/8", "a_b.test", ""],
)
def test_harbor_entries_harbor_refuses_are_refused(entry: str) -> None:
    with pytest.raises(PolicyError, match="harbor allowed_hosts"):
        from_harbor({"network_mode": "allowlist", "allowed_hosts": [entry]})


def test_any_port_task_rule_needs_an_any_port_evaluator_rule() -> None:
    evaluator = Policy(allow=["*.test:*", "pypi.org", "10.0.0.0/8:*"])
    task = Policy(allow=["a.test:*", "pypi.org:*", "10.1.0.0/16:*", "11.0.0.0/8:*"])
    kept = [r.text for r in compose(evaluator, task).allow_rules]
    assert kept == ["*.test:*", "pypi.org", "10.0.0.0/8:*", "a.test:*", "10.1.0.0/16:*"]


def test_harbor_bad_mode() -> None:
    with pytest.raises(PolicyError, match="network_mode"):
        from_harbor({"network_mode": "sometimes"})


# verifiers 0.4's NetworkPolicyConfig (issue 21): each case was decided otherwise before
# (tests/frameworks/test_verifiers_differential.py compares thousands against verifiers)
VERIFIERS = [
    # the default allow=["*"] is every port, not 80/443
    ("default-any-port", {}, ("https", "example.com", 8443), True),
    ("star-any-port", {"allow": ["*"]}, ("http", "198.18.0.2", 22), True),
    # a bare block domain covers its subdomains
    ("block-subdomain", {"block": ["example.com"]}, ("https", "sub.example.com", 443), False),
    ("block-apex", {"block": ["example.com"]}, ("http", "example.com", 8080), False),
    ("block-other", {"block": ["example.com"]}, ("https", "example.org", 443), True),
    # `*.x` is subdomains only
    ("star-dot-no-apex", {"allow": ["*.example.com"]}, ("https", "example.com", 443), False),
    ("star-dot-sub", {"allow": ["*.example.com"]}, ("https", "a.b.example.com", 443), True),
    # verifiers' proxy (NetworkPolicy.permits(connect=True)): CONNECT elsewhere than 443 only
    # under an `https://` rule naming the port (issue 31: 3,192 such CONNECTs were allowed)
    ("connect-22", {"allow": ["*.example.com"]}, ("https", "a.b.example.com", 22), False),
    ("connect-port-rule", {"allow": ["a.test:8443"]}, ("https", "a.test", 8443), False),
    ("connect-https-rule", {"allow": ["https://a.test:8443"]}, ("https", "a.test", 8443), True),
    ("http-port-rule", {"allow": ["a.test:8080"]}, ("http", "a.test", 8080), True),
    ("host-80", {"allow": ["a.test"]}, ("http", "a.test", 80), True),
    # a URL origin its own scheme and port
    ("url-scheme", {"allow": ["https://a.test"]}, ("http", "a.test", 443), False),
    ("url-port", {"allow": ["https://a.test"]}, ("https", "a.test", 443), True),
    # framework-only: network_access=False, allow=[], a `*` in block
    ("no-access", {"network_access": False}, ("https", "example.com", 443), False),
    ("empty-allow", {"allow": []}, ("https", "example.com", 443), False),
    ("star-block", {"block": ["x.test", "*"]}, ("https", "example.com", 443), False),
    # TaskData lists (alone: over the default runtime config)
    ("task-allow", {"network_allow": ["a.test"]}, ("https", "a.test", 443), True),
    ("task-allow-22", {"network_allow": ["a.test"]}, ("https", "a.test", 22), False),
    ("task-allow-other", {"network_allow": ["a.test"]}, ("https", "b.test", 443), False),
    ("task-block", {"network_block": ["a.test"]}, ("https", "x.a.test", 443), False),
    # issue 31: IDN block rules map to their IDNA form, never dropped
    ("idn-block", {"block": ["münchen.de"]}, ("https", "xn--mnchen-3ya.de", 443), False),
    ("idn-block-unicode", {"block": ["münchen.de"]}, ("https", "münchen.de", 443), False),
    ("idn-block-sub", {"block": ["münchen.de"]}, ("http", "a.münchen.de", 80), False),
    ("idn-glob-block", {"block": ["*.bücher.de"]}, ("https", "a.xn--bcher-kva.de", 443), False),
    ("fullwidth-block", {"block": ["ｅｖｉｌ.com"]}, ("https", "evil.com", 443), False),
    ("sharp-s-block", {"block": ["faß.de"]}, ("https", "faß.de", 443), False),
    ("sharp-s-2003-block", {"block": ["faß.de"]}, ("https", "fass.de", 443), False),
    ("ideographic-stop-block", {"block": ["evil。com"]}, ("https", "evil.com", 443), False),
    ("zero-width-block", {"block": ["ev\u200bil.com"]}, ("https", "evil.com", 443), False),
    ("soft-hyphen-block", {"block": ["e\u00advil.com"]}, ("https", "evil.com", 443), False),
    ("idn-allow", {"allow": ["bücher.de"]}, ("https", "xn--bcher-kva.de", 443), True),
    # numeric-looking patterns decide as verifiers decides them: by their text
    ("hex-allow", {"allow": ["0x8080808"]}, ("https", "8.8.8.8", 443), False),
    ("hex-tail-allow", {"allow": ["8.8.8.0x8"]}, ("https", "8.8.8.8", 443), False),
    ("query-allow", {"allow": ["0x7f?.local:80?q=1"]}, ("http", "0.0.0.127", 80), False),
    ("hex-block", {"block": ["0xcb007107"]}, ("https", "203.0.113.7", 443), False),
    ("decimal-block", {"block": ["3405803783"]}, ("https", "203.0.113.7", 443), False),
    ("short-block", {"block": ["5.1"]}, ("https", "9.5.0.1", 443), False),  # `9.5.1`
    # a block CIDR stays a CIDR; a bare IPv6 address is a rule
    ("cidr-block", {"block": ["10.0.0.0/8"]}, ("https", "10.9.9.9", 443), False),
    ("v6-block", {"block": ["2001:db8::1"]}, ("https", "[2001:db8::1]", 443), False),
    # verifiers' proxy refuses loopback names (is_loopback_host)
    ("localhost-name", {}, ("https", "a.localhost", 443), False),
]


@pytest.mark.parametrize(
    ("settings", "dest", "want"), [c[1:] for c in VERIFIERS], ids=[c[0] for c in VERIFIERS]
)
def test_verifiers_mapping(
    settings: dict[str, object], dest: tuple[str, str, int], want: bool
) -> None:
    scheme, host, port = dest
    assert allowed(from_verifiers(settings), host, port, scheme) is want


# `any_connect_port=True`: `NetworkPolicyConfig.permits` alone, every port of a bare rule
ANY_PORT = [
    ("host-any-port", {"allow": ["a.test"]}, ("http", "a.test", 8080), True),
    ("connect-any-port", {"allow": ["a.test"]}, ("https", "a.test", 22), True),
    ("connect-port-rule", {"allow": ["a.test:8443"]}, ("https", "a.test", 8443), True),
    ("no-loopback-block", {}, ("https", "a.localhost", 443), True),
    ("block-still", {"block": ["a.test"]}, ("https", "a.test", 22), False),
]


@pytest.mark.parametrize(
    ("settings", "dest", "want"), [c[1:] for c in ANY_PORT], ids=[c[0] for c in ANY_PORT]
)
def test_verifiers_any_connect_port(
    settings: dict[str, object], dest: tuple[str, str, int], want: bool
) -> None:
    scheme, host, port = dest
    policy = from_verifiers(settings, any_connect_port=True)
    assert allowed(policy, host, port, scheme) is want


def test_verifiers_task_intersects_the_runtime_allow_list() -> None:
    policy = from_verifiers({"allow": ["*.test"]}, task={"network_allow": ["a.test", "b.org"]})
    assert [r.text for r in policy.allow_rules] == ["a.test"]


@pytest.mark.parametrize(
    ("settings", "match"),
    [
        ({"allow": ["a.test"], "block": ["b.test"]}, "mutually exclusive"),
        ({"network_access": False, "allow": ["a.test"]}, "network_access=false"),
        ({"allow": ["*"], "extra": 1}, "unknown key"),
        ({"network_allow": ["a.test"], "image": "x"}, "unknown key"),
        ({"allow": "*"}, "allow"),
        ({"block": ["bü*.test"]}, "cannot be expressed exactly"),
    ],
    ids=["allow-and-block", "no-access-with-rules", "unknown", "task-unknown", "str", "glob"],
)
def test_verifiers_refusals(settings: dict[str, object], match: str) -> None:
    with pytest.raises(PolicyError, match=match):
        from_verifiers(settings)


# --- composition intersects patterns as sets of names (issue 31) ---------------------------

# a `?` in an evaluator pattern matched the literal `*` of the task's pattern text
WIDENING = [
    ("api-?.example.com", "api-*.example.com", "api-x.evil.example.com"),
    ("?*.example.com", "*.example.com", "example.com"),
    ("a?", "a*", "a.evil.test"),
    ("*.?.test", "*.*.test", "a.bc.test"),
]


@pytest.mark.parametrize(("evaluator", "task", "name"), WIDENING)
def test_a_task_pattern_never_widens_the_evaluator(evaluator: str, task: str, name: str) -> None:
    for ports in ("", ":*"):
        ev = Policy(allow=[evaluator + ports])
        composed = compose(ev, Policy(allow=[task + ports]))
        assert not allowed(ev, name)
        assert not allowed(composed, name), (evaluator, task, name, ports)


def test_a_narrower_task_pattern_is_kept() -> None:
    composed = compose(Policy(allow=["*.example.com:*"]), Policy(allow=["api-?.example.com:*"]))
    assert [r.text for r in composed.allow_rules] == ["*.example.com:*", "api-?.example.com:*"]


_SEGMENTS = ["a", "b", "ab", "?", "*", "a*", "*b", "?b", "a?", "x"]
_PORTS = ["", ":443", ":*", ":8080"]


@st.composite
def _pattern(draw: st.DrawFn) -> str:
    labels = draw(st.lists(st.sampled_from(_SEGMENTS), min_size=1, max_size=3))
    head = "*." if draw(st.booleans()) else ""
    return head + ".".join(labels) + ".test"


@st.composite
def _name_in(draw: st.DrawFn, pattern: str) -> str:
    """A name `pattern` (or its apex) matches, its wildcards filled from a tiny alphabet."""
    if pattern.startswith("*.") and draw(st.booleans()):
        pattern = pattern[2:]
    fill = st.sampled_from(["a", "b", "x", "ab", "a.b", "x.evil", "b.a"])
    out = []
    for ch in pattern:
        if ch == "*":
            out.append(draw(st.one_of(st.just(""), fill)))
        elif ch == "?":
            out.append(draw(st.sampled_from(["a", "b", "x"])))
        else:
            out.append(ch)
    name = "".join(out)
    return name if ".." not in name and not name.startswith(".") else "a.test"


@given(
    ev=st.lists(st.tuples(_pattern(), st.sampled_from(_PORTS)), min_size=1, max_size=2),
    task=st.lists(st.tuples(_pattern(), st.sampled_from(_PORTS)), min_size=1, max_size=2),
    data=st.data(),
)
@settings(max_examples=400, deadline=None)
def test_compose_never_allows_what_the_evaluator_refuses(
    ev: list[tuple[str, str]], task: list[tuple[str, str]], data: st.DataObject
) -> None:
    evaluator = Policy(allow=[p + port for p, port in ev])
    composed = compose(evaluator, Policy(allow=[p + port for p, port in task]))
    for pattern, _ in task:
        name = data.draw(_name_in(pattern))
        for scheme, port in (("https", 443), ("http", 80), ("https", 8080), ("http", 22)):
            if allowed(composed, name, port, scheme):
                assert allowed(evaluator, name, port, scheme), (name, scheme, port)


# --- address rules admit addresses, not names resolving into them (issue 31) ---------------


@pytest.mark.parametrize(
    "policy",
    [
        from_harbor({"network_mode": "allowlist", "allowed_hosts": ["198.18.250.2"]}),
        from_harbor({"network_mode": "allowlist", "allowed_hosts": ["198.18.0.0/15"]}),
        from_verifiers({"allow": ["198.18.250.2"]}),
        from_verifiers({"allow": ["https://198.18.250.2"]}),
    ],
    ids=["harbor-address", "harbor-cidr", "verifiers-address", "verifiers-url"],
)
def test_an_address_entry_admits_addresses_not_names(policy: Policy) -> None:
    """Harbor's sidecar and verifiers judge the name a client sent: allowlist
    `["198.18.250.2"]` with `other.test` pinned there gave 200 (issue 31)."""
    assert not getattr(policy, "resolve_names_for_address_rules", False)
    name = make_target("https", "other.test", 443)
    assert not policy.decide(name, [ipaddress.ip_address("198.18.250.2")]).allowed
    assert not policy.decide(name).needs_addrs  # refused without a lookup
    assert policy.decide(make_target("https", "198.18.250.2", 443)).allowed


def test_harbor_wildcards_that_name_nothing_are_refused() -> None:
    for entry in ("*.1.0x1", "*.0x1", "*.1.2.3.0x4"):
        with pytest.raises(PolicyError, match=f"{re.escape(entry)}.*cannot be expressed"):
            from_harbor({"network_mode": "allowlist", "allowed_hosts": [entry]})
    policy = from_harbor({"network_mode": "allowlist", "allowed_hosts": ["*.0.0.1"]})
    assert allowed(policy, "10.0.0.1")
    assert not allowed(policy, "10.0.1.1")


# --- a verifiers block is never lost to a spelling (issue 31) ------------------------------

_SPELL_PART = st.sampled_from(["dec", "hex", "oct"])


def _aton_part(value: int, style: str) -> str:
    return {"dec": str(value), "hex": hex(value), "oct": f"0{value:o}"}[style]


@given(
    parts=st.lists(st.tuples(st.integers(0, 300), _SPELL_PART), min_size=1, max_size=4),
    prefix=st.lists(st.tuples(st.integers(0, 255), _SPELL_PART), max_size=3),
    port=st.sampled_from([443, 80, 22]),
)
@settings(max_examples=300, deadline=None)
def test_a_numeric_block_blocks_every_spelling_verifiers_blocks(
    parts: list[tuple[int, str]], prefix: list[tuple[int, str]], port: int
) -> None:
    """verifiers blocks the text `q` and every text ending in `.q`; whatever address such a
    text reaches through our proxy is blocked here."""
    q = ".".join(_aton_part(v, s) for v, s in parts)
    sent = ".".join([*(_aton_part(v, s) for v, s in prefix), q])
    policy = from_verifiers({"block": [q]})
    try:
        target = make_target("https", sent, port)
    except TargetError:
        return  # our proxy refuses the text itself
    assert not policy.decide(target).allowed, (q, sent, [r.text for r in policy.block_rules])


_IP_SPELLINGS = st.one_of(
    st.builds(lambda n: str(ipaddress.IPv4Address(n)), st.integers(0, 2**32 - 1)),
    st.builds(lambda n: hex(n), st.integers(0, 2**32 - 1)),
    st.builds(lambda n: str(n), st.integers(0, 2**32 - 1)),
    st.builds(lambda a, n: f"{a}.{n}", st.integers(0, 255), st.integers(0, 2**24 - 1)),
    st.builds(lambda n: f"::ffff:{ipaddress.IPv4Address(n)}", st.integers(0, 2**32 - 1)),
    st.builds(lambda n: f"::{ipaddress.IPv4Address(n)}", st.integers(0, 2**32 - 1)),
    st.builds(lambda n: str(ipaddress.IPv6Address(n)), st.integers(0, 2**128 - 1)),
)


@given(
    glob=st.text("0123456789abcdefx.*", min_size=1, max_size=8).filter(lambda g: "*" in g),
    sent=_IP_SPELLINGS,
)
@settings(max_examples=500, deadline=None)
def test_a_glob_block_blocks_every_address_spelling_verifiers_blocks(glob: str, sent: str) -> None:
    """A block glob verifiers matches against an address's spelling blocks the address."""
    try:
        policy = from_verifiers({"block": [glob]})
    except PolicyError:
        return
    if glob in ("*", "*."):
        return  # framework-only
    try:
        target = make_target("https", sent, 443)
    except TargetError:
        return
    text = sent.lower().rstrip(".")
    if fnmatch.fnmatchcase(text, glob.rstrip(".")) or text.endswith("." + glob):
        assert not policy.decide(target).allowed, (glob, sent)


@pytest.mark.parametrize(
    ("evaluator", "task", "report_only"),
    [(True, True, True), (True, False, False), (False, True, False), (False, False, False)],
)
def test_the_mode_is_the_stricter(evaluator: bool, task: bool, report_only: bool) -> None:
    """Report-only composes like the posture: it holds only when both sides say so (it was
    dropped: two report-only policies composed into one that enforced)."""
    both = compose(
        Policy(allow=["pypi.org"], report_only=evaluator),
        Policy(allow=["pypi.org"], report_only=task),
    )
    assert both.report_only is report_only
