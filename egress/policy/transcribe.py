"""verifiers' rules written in our rule language: `verifiers_policy`, the `Policy` never wider
than verifiers' own decision (docs/policy.md#verifiers); `verifiers.py` reads the inputs and
applies verifiers' own semantics, this module the spelling.

Pure. A rule is read as verifiers reads it (`parse_verifiers_rule`: its
`parse_network_rule`), then each rule is rewritten in our rule language (`**.x` for
verifiers' `*.x`, which never includes the apex, `*.x:*` for a block's bare `x`). verifiers
compares the text a client sent; our proxy judges the canonical name or address
(`normalize_host`). So an allow rule admits a name only where verifiers allows its canonical
or U-label spelling (an IDN rule maps to its IDNA form; a numeric or compatibility spelling
such as `0x8080808` allows nothing here), and a block rule blocks at least every name or
address that any spelling it matches reaches (the IDNA forms of a Unicode name, the address
of a numeric text, a CIDR whole). Where that cannot be exact, ours is narrower, never wider;
a glob we cannot write at all is a `PolicyError` naming the rule.

verifiers' proxy refuses a CONNECT to a port other than 443 unless an allow rule spelled
`https://...` names that port (or `*` is allowed), and refuses loopback names: so do ours,
unless `any_connect_port`.
"""

from __future__ import annotations

import ipaddress
import re
from itertools import product
from urllib.parse import SplitResult, urlsplit

import idna

from ..errors import PolicyError, TargetError
from .rules import Policy
from .target import (
    bracket,
    canonical_ip,
    normalize_host,
    normalize_label,
    parse_inet_aton,
    parse_ip_literal,
)


def parse_verifiers_rule(rule: str) -> tuple[SplitResult, str, int | None]:
    """`parse_network_rule`: (the parsed URL, the lower-cased host without trailing dots,
    the port or the scheme's default). Raises ValueError as urlsplit does."""
    parsed = urlsplit(rule if "://" in rule else f"//{rule}")
    port = parsed.port
    if parsed.scheme and port is None:
        port = 443 if parsed.scheme == "https" else 80
    return parsed, (parsed.hostname or "").lower().rstrip("."), port


# UTS 46 maps these full stops to "." (`evil。com` is `evil.com` to a client that encodes it)
_FULL_STOPS = str.maketrans({"\u3002": ".", "\uff0e": ".", "\uff61": "."})
_ATON_PART = re.compile(r"0x[0-9a-f]*|[0-9]+")  # a part inet_aton reads (target.py)
_OCTET = re.compile(r"0|[1-9][0-9]{0,2}")  # a part as a canonical dotted quad spells it
_IP_TEXT = frozenset("0123456789abcdefx.")  # every character of an IPv4 or IPv6 spelling
_GLOB_SEGMENT = re.compile(r"[a-z0-9_*-]+")  # a glob segment some canonical label can match
_ALL_V4, _ALL_V6 = "0.0.0.0/0:*", "::/0:*"
_LOOPBACK_NAMES = "*.localhost:*"  # verifiers' proxy refuses these names (is_loopback_host)
_MAX_FORMS = 16


def verifiers_policy(allow: list[str], block: list[str], any_connect_port: bool) -> Policy:
    if not allow:
        return Policy(default="deny")  # framework-only: the framework routes alone
    ours_block = [r for rule in block for r in _block_rules(rule)]
    if not any_connect_port:
        ours_block.append(_LOOPBACK_NAMES)
    ours_block = list(dict.fromkeys(ours_block))
    if "*" in allow:  # `*` matches every host, port and scheme, CONNECT included
        return Policy(block=ours_block, default="allow")
    ours_allow = [r for rule in allow for r in _allow_rules(rule, any_connect_port)]
    return Policy(allow=list(dict.fromkeys(ours_allow)), block=ours_block, default="deny")


def _parsed(rule: str) -> tuple[str, str, int | None] | None:
    """(scheme, host pattern, port) as verifiers reads `rule`; None when it can match no
    destination (urlsplit refuses it, no host, port 0, a scheme other than http/https)."""
    try:
        parsed, pattern, port = parse_verifiers_rule(rule)
    except ValueError:
        return None  # network_rule_matches: a rule that does not parse matches nothing
    if not pattern or parsed.scheme not in ("", "http", "https") or port == 0:
        return None
    return parsed.scheme, pattern, port


# --- allow rules ---


def _allow_rules(rule: str, any_connect_port: bool) -> list[str]:
    """Our allow rule for one verifiers allow rule, [] when it allows no canonical
    destination. verifiers compares the text a client sent: an allow rule admits a
    destination only in the canonical spelling our proxy judges, or (an IDN) its U-label
    spelling (docs/policy.md#verifiers)."""
    parsed = _parsed(rule)
    if parsed is None:
        return []
    scheme, pattern, port = parsed
    host = _allow_host(rule, pattern)
    if host is None:
        return []
    if scheme == "http":
        return [f"http://{host}:{port}"]
    if scheme == "https":
        # verifiers' proxy: CONNECT elsewhere than 443 only under a rule spelled `https://`
        if any_connect_port or port == 443 or rule.lower().startswith("https://"):
            return [f"https://{host}:{port}"]
        return []
    if port is None:
        # any port and scheme in `permits`; verifiers' proxy: CONNECT to 443 only, plain
        # HTTP to any port, which no rule of ours says: ours is 443 and 80 (narrower)
        return [f"{host}:*"] if any_connect_port else [host]
    if port == 443 or any_connect_port:
        return [f"{host}:{port}"]
    return [f"http://{host}:{port}"]  # the proxy refuses CONNECT to it


def _allow_host(rule: str, pattern: str) -> str | None:
    """The host in our syntax matching exactly the canonical hosts `pattern` matches (in
    their canonical or U-label spelling), None when it matches none."""
    if "*" not in pattern:
        try:
            canonical = normalize_host(pattern)
        except TargetError:
            return None  # a text our proxy refuses: no destination is spelled so
        if canonical == pattern or (not pattern.isascii() and _u_spelling(canonical) == pattern):
            return bracket(canonical)  # the name in its canonical or its U-label spelling
        return None  # `0x8080808`, `10.1`, `ｅｖｉｌ.com`: verifiers matches that text only
    labels = []
    unicode = not pattern.isascii()  # then every literal label must be in U-label spelling
    for segment in pattern.split("."):
        if "*" in segment:
            if not segment.isascii():
                raise _inexpressible(rule, "a glob over non-ASCII text names U-labels only")
            if not _GLOB_SEGMENT.fullmatch(segment):
                return None  # a character no canonical label has
            labels.append(segment)
            continue
        try:
            label = normalize_label(segment, rule)
        except (TargetError, ValueError):
            return None  # every host this matches has a label our proxy refuses
        if (_u_spelling(label) if unicode else label) != segment:
            return None  # a spelling of the name that is neither of its two
        labels.append(label)
    host = ".".join(labels)
    # verifiers' `*.x` never matches `x`; our leading `*.` does, `**.x` does not
    return "*" + host if host.startswith("*.") else host


def _u_spelling(canonical: str) -> str | None:
    """`canonical` with every A-label decoded (the U-label spelling of the name)."""
    labels = []
    for label in canonical.split("."):
        if label.startswith("xn--"):
            try:
                label = idna.decode(label)
            except (idna.IDNAError, UnicodeError):
                return None
        labels.append(label)
    return ".".join(labels)


# --- block rules ---


def _block_rules(rule: str) -> list[str]:
    """Our block rules for one verifiers block rule: at least every canonical destination
    whose spelling verifiers blocks in any form a client can send (docs/policy.md#verifiers:
    a block here may block more, never less)."""
    network = _network(rule)
    if network is not None:
        return [network]  # a CIDR stays a CIDR, a bare IPv6 address is one (as E2B reads them)
    parsed = _parsed(rule)
    if parsed is None:
        return []
    scheme, pattern, port = parsed
    hosts, everywhere = _block_hosts(rule, pattern)
    out = []
    for host in hosts:
        if scheme:
            out.append(f"{scheme}://{host}:{port}")
        else:
            out.append(f"{host}:{port if port is not None else '*'}")
    return [*out, *everywhere]


def _network(rule: str) -> str | None:
    """A block rule that is a CIDR or a bare IPv6 address, as our `ADDR:*` / `CIDR:*`."""
    text = rule.strip()
    if "://" in text or not ("/" in text or text.count(":") > 1):
        return None
    try:
        network = ipaddress.ip_network(text, strict=False)
    except ValueError:
        return None
    if network.num_addresses == 1:
        return f"{bracket(str(canonical_ip(network.network_address)))}:*"
    return f"{network}:*"


def _block_hosts(rule: str, pattern: str) -> tuple[list[str], list[str]]:
    """(host patterns for the rule's port and scheme, every-port networks) covering every
    canonical destination a spelling of which `pattern` blocks."""
    if "*" not in pattern:
        if ":" in pattern:  # an IPv6 literal ([...] in the rule)
            return _canonical_hosts(pattern), []
        last = pattern.rsplit(".", 1)[-1]
        if _ATON_PART.fullmatch(last):
            return _numeric_suffix(pattern, exact=True)
        return [_subdomains(h) for h in _name_forms(pattern)], []
    globs = _glob_forms(rule, pattern)
    if not set(pattern) - {"*"} <= _IP_TEXT:
        return globs, []  # a literal character no address spelling has
    segments = pattern.split(".")
    if "*" not in segments[-1] and not _ATON_PART.fullmatch(segments[-1]):
        return globs, []  # a name's last label: no address spelling ends so
    if pattern.startswith("*.") and "*" not in pattern[2:]:
        # `*.x` is what a bare `x` blocks besides itself
        hosts, nets = _numeric_suffix(pattern[2:], exact=False)
        return [*globs, *hosts], nets
    if segments[-1] == "*" and 1 < len(segments) <= 4:
        if all(_OCTET.fullmatch(s) and int(s) <= 255 for s in segments[:-1]):
            return globs, []  # `10.0.0.*`: every spelling it matches is canonical up to `*`
    # an address spelling this glob matches may be canonical in a form it does not match:
    # every address literal is blocked (docs/policy.md#verifiers)
    return globs, [_ALL_V4, _ALL_V6]


def _subdomains(host: str) -> str:
    return bracket(host) if parse_ip_literal(host) is not None else f"*.{host}"


def _canonical_hosts(text: str) -> list[str]:
    try:
        return [bracket(normalize_host(text))]
    except TargetError:
        return []  # our proxy refuses this text


def _name_forms(name: str) -> list[str]:
    """The canonical names a client reaches when it sends `name`: our proxy's normalization of
    the text, and the ASCII forms IDNA 2008 (UTS 46) and IDNA 2003 encoders give it."""
    spellings = [name, name.translate(_FULL_STOPS)]
    if not name.isascii():
        mapped = name.translate(_FULL_STOPS)
        for encode in (_uts46, _idna2003):
            text = encode(mapped)
            if text is not None:
                spellings.append(text)
    forms = []
    for spelling in spellings:
        try:
            forms.append(normalize_host(spelling))
        except TargetError:
            continue
    return list(dict.fromkeys(forms))


def _uts46(text: str) -> str | None:
    try:
        return idna.encode(text, uts46=True).decode("ascii")
    except (idna.IDNAError, UnicodeError, ValueError):
        return None


def _idna2003(text: str) -> str | None:
    try:
        return text.encode("idna").decode("ascii")
    except (UnicodeError, ValueError):
        return None


def _glob_forms(rule: str, pattern: str) -> list[str]:
    """A glob block in our syntax, once per canonical form of its literal labels."""
    options: list[list[str]] = []
    for segment in pattern.translate(_FULL_STOPS).split("."):
        if "*" in segment:
            if not segment.isascii():
                raise _inexpressible(rule, "a glob over non-ASCII text names U-labels only")
            if not _GLOB_SEGMENT.fullmatch(segment):
                return []  # every host this matches has a character our proxy refuses
            options.append([segment])
            continue
        forms = _label_forms(segment)
        if not forms:
            return []  # every host this matches has a label our proxy refuses
        options.append(forms)
    out = []
    for labels in product(*options):
        host = ".".join(labels)
        out.append("*" + host if host.startswith("*.") else host)
        if len(out) >= _MAX_FORMS:
            raise _inexpressible(rule, "too many spellings of its labels")
    return list(dict.fromkeys(out))


def _label_forms(label: str) -> list[str]:
    forms = []
    for text in (label, _idna2003(label)):
        if text is None:
            continue
        try:
            forms.append(normalize_label(text, label))
        except (TargetError, ValueError):
            continue
    return list(dict.fromkeys(forms))


def _numeric_suffix(pattern: str, *, exact: bool) -> tuple[list[str], list[str]]:
    """What verifiers blocks with a numeric pattern `q`: the text `q` itself (`exact`) and
    every text ending in `.q`, as canonical dotted quads. A text of k parts ending in the m
    parts of `q` reads (inet_aton) as k-m free bytes and the bytes `q`'s parts fill there, so
    each k is one glob: `*.5.0.1` for `q = 5.1` in three parts. An IPv6 literal ending in a
    dotted quad (`::1.2.0.1`) ends in `q` too when `q` is short: every IPv6 literal is then
    blocked."""
    parts = pattern.split(".")
    hosts = []
    for k in range(len(parts), 5):
        if k == len(parts) and not exact:
            continue
        address = parse_inet_aton(".".join(["0"] * (k - len(parts)) + parts))
        if address is not None:
            octets = str(address).split(".")
            hosts.append(".".join(["*"] * (k - len(parts)) + octets[k - len(parts) :]))
    embedded = len(parts) < 4 and all(_OCTET.fullmatch(p) and int(p) <= 255 for p in parts)
    return hosts, [_ALL_V6] if embedded else []


def _inexpressible(rule: str, why: str) -> PolicyError:
    return PolicyError(f"verifiers rule {rule!r} cannot be expressed exactly: {why}")


__all__ = ["parse_verifiers_rule", "verifiers_policy"]
