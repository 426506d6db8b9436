"""Canonical destinations: the one string that is judged, resolved, dialed and logged.

Strategy: every host that reaches a decision passes through `normalize_host` first, and the
string it returns is the only one used afterwards. A host that cannot be normalized raises
`TargetError` (400) *before* any matching, because `fnmatch`'s `*` would otherwise happily
match `evil.com/.example.com`.

IPv4 follows the C library's `inet_aton` (what `getaddrinfo` does with a numeric host): one to
four parts, each decimal, octal (leading `0`) or hex (`0x`), the last part filling the
remaining bytes, so `2130706433`, `0177.0.0.1`, `0x7f.1` and `127.1` all become `127.0.0.1`.
Like the WHATWG URL standard, a name whose last label is numeric must be a valid IPv4 address
or it is refused: such a name is never a real DNS name, and sending it to a resolver would let
the resolver's own numeric parsing disagree with ours.

Pure: stdlib and `idna` only; no sockets.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal

import idna

from ..errors import TargetError

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network

# RFC 1035 2.3.4: a label is at most 63 octets and a name at most 253 (255 on the wire, less
# the length byte and the root label).
MAX_LABEL = 63
MAX_NAME = 253

_ASCII_LABEL = re.compile(r"[a-z0-9_-]+")
_NUMERIC_LABEL = re.compile(r"(?:0x[0-9a-f]*|[0-9]+)")
_HOST_CHARS = re.compile(r"[^\s/#\\%@?\[\]:]+")

_DIGITS = {8: "01234567", 10: "0123456789", 16: "0123456789abcdefABCDEF"}

Scheme = Literal["http", "https"]
DEFAULT_PORTS: dict[str, int] = {"http": 80, "https": 443}


@dataclass(frozen=True, slots=True)
class Target:
    """A destination as the policy sees it.

    `scheme` says how the client asked: `https` for a CONNECT tunnel, `http` for an
    absolute-form request. `host` is canonical; `ip` is set when the host is an IP literal.
    """

    scheme: Scheme
    host: str
    port: int
    ip: IPAddress | None = None

    def __str__(self) -> str:
        host = bracket(self.host)
        return f"{self.scheme}://{host}:{self.port}"


def parse_inet_aton(text: str) -> ipaddress.IPv4Address | None:
    """Parse `text` exactly as glibc's `inet_aton` would, or return None.

    Why not `ipaddress.IPv4Address`: it rejects `2130706433` and `0x7f.1`, which the C
    library (and so every client and resolver) happily turns into 127.0.0.1.
    """
    parts = text.split(".")
    if not 1 <= len(parts) <= 4:
        return None
    values: list[int] = []
    for part in parts:
        value = _parse_aton_part(part)
        if value is None:
            return None
        values.append(value)
    *head, last = values
    if any(v > 0xFF for v in head) or last >= 1 << (8 * (4 - len(head))):
        return None
    number = 0
    for v in head:
        number = (number << 8) | v
    number = (number << (8 * (4 - len(head)))) | last
    return ipaddress.IPv4Address(number)


def _parse_aton_part(part: str) -> int | None:
    if part[:2] in ("0x", "0X"):
        digits, base = part[2:], 16
        if digits == "":
            return 0  # glibc accepts a bare "0x" as zero
    elif part.startswith("0") and len(part) > 1:
        digits, base = part[1:], 8
    else:
        digits, base = part, 10
    if not digits or not all(c in _DIGITS[base] for c in digits):
        return None
    value = int(digits, base)
    return value if value <= 0xFFFFFFFF else None


def canonical_ip(addr: IPAddress) -> IPAddress:
    """IPv4-mapped IPv6 (`::ffff:a.b.c.d`) is the IPv4 address; others are themselves."""
    if isinstance(addr, ipaddress.IPv6Address):
        if addr.ipv4_mapped is not None:
            return addr.ipv4_mapped
        if addr.scope_id is not None:
            return ipaddress.IPv6Address(str(addr).split("%", 1)[0])
    return addr


def canonical_addresses(raw_addrs: Iterable[object]) -> tuple[IPAddress, ...]:
    """`getaddrinfo` sockaddr hosts -> canonical addresses, deduplicated, order kept."""
    seen: dict[IPAddress, None] = {}
    for raw in raw_addrs:
        text = str(raw).split("%", 1)[0]
        seen[canonical_ip(ipaddress.ip_address(text))] = None
    return tuple(seen)


def parse_ip_literal(host: str) -> IPAddress | None:
    """Return the canonical address if `host` is an IP literal in any accepted spelling.

    Accepts `[v6]`, v6 with a zone id, and every `inet_aton` spelling of IPv4.
    """
    text = host
    if text.startswith("[") and text.endswith("]"):
        text = text[1:-1]
        if ":" not in text:
            return None
    if ":" in text:
        text = text.split("%", 1)[0]
        try:
            return canonical_ip(ipaddress.IPv6Address(text))
        except ValueError:
            return None
    return parse_inet_aton(text[:-1] if text.endswith(".") else text)


def normalize_host(raw: str) -> str:
    """Return the canonical form of a host name or IP literal; raise `TargetError` (400).

    Canonical: lowercase; one trailing dot stripped; IDNA A-labels; IPv6 without brackets or
    zone id, compressed; IPv4 (every `inet_aton` spelling, and IPv4-mapped IPv6) dotted-quad.
    """
    if not raw:
        raise TargetError("empty host")
    ip = parse_ip_literal(raw)
    if ip is not None:
        return str(ip)
    if raw.startswith("[") or ":" in raw:
        raise TargetError(f"invalid IPv6 literal {raw!r}")
    name = raw[:-1] if raw.endswith(".") else raw
    if not name:
        raise TargetError(f"invalid host {raw!r}: empty name")
    if not _HOST_CHARS.fullmatch(name):
        raise TargetError(f"invalid host {raw!r}: only letters, digits, '-', '_' and '.' allowed")
    labels = [normalize_label(label, raw) for label in name.split(".")]
    canonical = ".".join(labels)
    if len(canonical) > MAX_NAME:
        raise TargetError(f"invalid host {raw!r}: name longer than {MAX_NAME} bytes")
    if _NUMERIC_LABEL.fullmatch(labels[-1]):
        raise TargetError(f"invalid host {raw!r}: numeric last label but not an IPv4 address")
    return canonical


def normalize_label(label: str, raw: str) -> str:
    if not label:
        raise TargetError(f"invalid host {raw!r}: empty label")
    if label.isascii():
        out = label.lower()
        if not _ASCII_LABEL.fullmatch(out):
            raise TargetError(
                f"invalid host {raw!r}: only letters, digits, '-', '_' and '.' allowed"
            )
        if out.startswith("xn--"):
            try:  # an A-label must decode, or two spellings could name one host
                idna.decode(out)
            except (idna.IDNAError, UnicodeError) as exc:
                raise TargetError(f"invalid host {raw!r}: bad IDNA A-label ({exc})") from exc
    else:
        try:
            out = idna.encode(label, uts46=True).decode("ascii")
        except idna.IDNAError as exc:
            raise TargetError(f"invalid host {raw!r}: not a valid IDNA label ({exc})") from exc
        if "." in out or not _ASCII_LABEL.fullmatch(out):
            raise TargetError(f"invalid host {raw!r}: IDNA mapping produced {out!r}")
    if len(out) > MAX_LABEL:
        raise TargetError(f"invalid host {raw!r}: label longer than {MAX_LABEL} bytes")
    return out


def make_target(scheme: Scheme, host: str, port: int) -> Target:
    """Build a canonical `Target`; raise `TargetError` for a bad host or port."""
    if not 1 <= port <= 65535:
        raise TargetError(f"invalid port {port}: must be 1-65535")
    canonical = normalize_host(host)
    ip = parse_ip_literal(canonical)
    return Target(scheme=scheme, host=canonical, port=port, ip=ip)


def _parse_port(text: str, what: str) -> int:
    if not text.isdigit() or len(text) > 5 or not text.isascii():
        raise TargetError(f"invalid port {text!r} in {what!r}")
    port = int(text)
    if not 1 <= port <= 65535:
        raise TargetError(f"invalid port {text!r} in {what!r}: must be 1-65535")
    return port


def split_host_port(authority: str) -> tuple[str, str | None]:
    """Split `host[:port]` / `[v6][:port]`; the port is returned as text (or None)."""
    if authority.startswith("["):
        end = authority.find("]")
        if end < 0:
            raise TargetError(f"unterminated IPv6 literal in {authority!r}")
        host, rest = authority[: end + 1], authority[end + 1 :]
        if not rest:
            return host, None
        if not rest.startswith(":"):
            raise TargetError(f"unexpected text after IPv6 literal in {authority!r}")
        return host, rest[1:]
    if authority.count(":") > 1:
        raise TargetError(f"IPv6 literal must be in brackets in {authority!r}")
    host, sep, port = authority.partition(":")
    return host, (port if sep else None)


def parse_authority(authority: str) -> Target:
    """Parse a CONNECT request-target (`host:port`, `[v6]:port`); the port is required."""
    if "@" in authority:
        raise TargetError(f"userinfo not allowed in CONNECT target {authority!r}")
    host, port = split_host_port(authority)
    if port is None or port == "":
        raise TargetError(f"CONNECT target {authority!r} has no port")
    return make_target("https", host, _parse_port(port, authority))


@dataclass(frozen=True, slots=True)
class ParsedURL:
    """An absolute URL split into the parts the proxy needs; `path` includes the query."""

    target: Target
    path: str
    explicit_port: bool


def split_url(url: str) -> tuple[str, str, str]:
    """`scheme://authority/path` -> (lowercase scheme, authority, path); the path without a
    fragment and never empty. Raises TargetError when `url` is not absolute."""
    scheme, sep, rest = url.partition("://")
    if not sep:
        raise TargetError(f"not an absolute URL: {url!r}")
    cut = len(rest)
    for ch in "/?#":
        pos = rest.find(ch)
        if 0 <= pos < cut:
            cut = pos
    authority, path = rest[:cut], rest[cut:]
    if path.startswith("#"):
        path = ""
    path = path.split("#", 1)[0] or "/"
    if not path.startswith("/"):
        path = "/" + path
    return scheme.lower(), authority, path


def url_target(scheme: str, authority: str, url: str) -> tuple[Target, bool]:
    """The `Target` of a URL's authority and whether it named a port; refuses userinfo.

    Pure and independent of the path, so the proxy caches it per authority."""
    if "@" in authority:
        raise TargetError(f"userinfo not allowed in URL {url!r}")
    if not authority:
        raise TargetError(f"URL {url!r} has no host")
    host, port_text = split_host_port(authority)
    port = DEFAULT_PORTS[scheme] if not port_text else _parse_port(port_text, url)
    return make_target("https" if scheme == "https" else "http", host, port), bool(port_text)


def parse_url(url: str, *, schemes: tuple[str, ...] = ("http",)) -> ParsedURL:
    """Parse an absolute-form URL `scheme://host[:port][/path]`; refuse userinfo (400)."""
    scheme = url.partition("://")[0].lower()
    if "://" not in url or scheme not in schemes:
        allowed = " or ".join(f"{s}://" for s in schemes)
        raise TargetError(f"not an absolute {allowed} URL: {url!r}")
    scheme, authority, path = split_url(url)
    target, explicit_port = url_target(scheme, authority, url)
    return ParsedURL(target=target, path=path, explicit_port=explicit_port)


def bracket(host: str) -> str:
    """`host` as it appears in an authority: an IPv6 literal in brackets (`[::1]`)."""
    return f"[{host}]" if ":" in host else host


def join_host_port(host: str, port: int | str) -> str:
    """`host:port`, with an IPv6 literal in brackets (`[::1]:8080`)."""
    return f"{bracket(host)}:{port}"


def host_header(target: Target, explicit_port: bool = False) -> str:
    """The `Host` header value for a request to `target` (port omitted when default)."""
    host = bracket(target.host)
    if target.port == DEFAULT_PORTS[target.scheme] and not explicit_port:
        return host
    return f"{host}:{target.port}"
