"""The gate: every admission decision the proxy makes, as pure functions of data.

Pure (no sockets, no asyncio). The server reads bytes and dials; at each stage it asks the gate
and gets back an `Admit` or a `Verdict(reason, detail)` (like mitmproxy's layer commands), and
only carries that out. So the whole of "who may go where" is testable without root or sockets
(`tests/unit/test_gate.py` drives every reason code through it).

Stages, in the order the server asks (docs/architecture.md#one-request):

1. `admit_connection` / `admit_client`: connection caps, shutdown, the audit log's health.
2. `refuse_head`, `HEAD_TIMEOUT`: a head that could not be read.
3. `Gate.connect_target` / `Gate.request_target`: the request target, parsed (cached: pure).
4. `Gate.identify`: listener-bound identity, token or source address -> `Identity`, or 407.
5. `Gate.decide` then `Gate.admit`: the policy and guard verdict before and after resolution;
   the verdict cache is per policy *object* (a `WeakKeyDictionary`), so a verdict can never be
   served to another policy, even one that reuses a freed policy's `id()`.
6. `refuse_resolve`, `refuse_dial`: resolution and connection failures.
7. `Gate.wants_sni` and `Gate.sni`: the TLS SNI check of a tunnel; `Gate.lookup`: a DNS query.
8. `keep_alive_after` and `response_step`: what a refusal or a 1xx/101 means for the connection.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Final, Literal
from weakref import WeakKeyDictionary

from ...errors import ProtocolError, TargetError
from ...policy.addrs import AddressGuard
from ...policy.judge import judge, judge_name
from ...policy.rules import Decision, Policy
from ...policy.target import (
    IPAddress,
    Target,
    parse_authority,
    parse_ip_literal,
    split_url,
    url_target,
)
from ...reasons import DecisionWord, Reason, reason_of
from ..codec.http1 import RequestHead
from ..codec.tls_hello import ClientHelloResult
from .clients import AuthError, ClientTable, Identity, source_address

SniMissing = Literal["if-named", "allow", "deny"]
CACHE_MAX: Final = 65536  # entries per cache before it is cleared (docs/architecture.md)


@dataclass(frozen=True, slots=True)
class Admit:
    """Go on: `reason` and `rule` are what the audit line will say."""

    reason: str
    rule: str | None = None
    # report-only (docs/policy.md#report-only-mode): "block" when the policy would refuse;
    # `detail` then says why
    would: str | None = None
    detail: str = ""

    def __repr__(self) -> str:
        extra = f", would={self.would}" if self.would else ""
        return f"Admit({self.reason}" + (f", rule={self.rule!r}" if self.rule else "") + extra + ")"


@dataclass(frozen=True, slots=True)
class Verdict:
    """Stop: answer `reason` (its status, or `status` when given) and audit it."""

    reason: Reason
    detail: str
    rule: str | None = None
    status: int | None = None  # overrides the reason's own (505 for a bad_request)
    where: tuple[str, int] | None = None  # host, port of a target refused before parsing

    def __repr__(self) -> str:
        extra = f", rule={self.rule!r}" if self.rule else ""
        extra += f", status={self.status}" if self.status is not None else ""
        return f"Verdict({self.reason.value}, {self.detail!r}{extra})"

    @property
    def decision(self) -> DecisionWord:
        return self.reason.decision

    @property
    def answer_status(self) -> int:
        return self.status if self.status is not None else self.reason.status


HEAD_TIMEOUT: Final = Verdict(Reason.HEAD_TIMEOUT, "request head not received")
AUDIT_DOWN: Final = Verdict(Reason.AUDIT_UNAVAILABLE, "audit log cannot be written")


def admit_connection(
    open_connections: int, max_connections: int, *, closing: bool, audit_ok: bool
) -> Verdict | None:
    """A new connection before any byte: None to serve it, else why not (503)."""
    if open_connections > max_connections or closing:
        return Verdict(Reason.TOO_MANY_CONNECTIONS, "connection limit reached")
    if not audit_ok:
        return AUDIT_DOWN
    return None


def admit_client(client_connections: int, cap: int) -> Verdict | None:
    """A connection once its client is known: at most `cap` per client (docs/proxy.md#limits)."""
    if client_connections > cap:
        return Verdict(Reason.TOO_MANY_CONNECTIONS, "per-client connection limit reached")
    return None


def refuse_head(exc: ProtocolError) -> Verdict:
    """A request head that could not be parsed: 431 for size, else 400 (or 505)."""
    if exc.status == 431:
        return Verdict(Reason.HEAD_TOO_LARGE, str(exc), status=431)
    return Verdict(Reason.BAD_REQUEST, str(exc), status=exc.status)


def refuse_resolve(exc: BaseException, host: str) -> Verdict:
    """A failed name resolution: `dns_timeout` for a lookup that ran out of time (the
    resolver's `ResolveTimeout`, or a bare TimeoutError), else `dns_error`."""
    if isinstance(exc, TimeoutError) or getattr(exc, "reason", None) == "dns_timeout":
        return Verdict(Reason.DNS_TIMEOUT, str(exc) or f"resolving {host!r} timed out")
    return Verdict(Reason.DNS_ERROR, str(exc))


def refuse_dial(exc: BaseException, addr: IPAddress, port: int) -> Verdict:
    """A failed connection to a checked address."""
    where = str(addr)
    if isinstance(exc, TimeoutError):
        return Verdict(Reason.CONNECTION_TIMEOUT, f"connecting to {where} port {port} timed out")
    if isinstance(exc, ConnectionRefusedError):
        return Verdict(Reason.CONNECTION_REFUSED, f"{where} port {port} refused the connection")
    why = exc.strerror if isinstance(exc, OSError) and exc.strerror else exc
    return Verdict(Reason.UPSTREAM_ERROR, f"cannot connect to {where} port {port}: {why}")


def refuse_upstream(detail: str) -> Verdict:
    return Verdict(Reason.UPSTREAM_ERROR, detail, status=502)


def refuse_request(detail: str) -> Verdict:
    return Verdict(Reason.BAD_REQUEST, detail, status=400)


def keep_alive_after(refusal: Verdict, *, bodiless: bool, keep_alive: bool, closing: bool) -> bool:
    """May the client connection serve another request after answering `refusal`?

    Only after a policy refusal (block, its own status) of a bodiless request: the connection
    is then in a known state. Anything else (a body we did not read, a broken head, auth)
    closes it (docs/proxy.md#error-responses)."""
    return (
        bodiless
        and keep_alive
        and refusal.reason.decision == "block"
        and refusal.status is None
        and not closing
    )


ResponseStep = Literal["interim", "final"]


def response_step(status: int) -> ResponseStep | Verdict:
    """An upstream response head's status: relay a 1xx and read on, refuse a 101 (Upgrade is
    not forwarded), or it is the final response."""
    if status == 101:
        return refuse_upstream("upstream switched protocols (Upgrade is not forwarded)")
    if 100 <= status < 200:
        return "interim"
    return "final"


class Gate:
    """Identity, target and verdict for one proxy: the clients, the guard and two caches.

    The caches hold only pure results (parsed targets; verdicts per policy object), so reuse
    never changes a decision. `set_guard` drops every verdict (the host's addresses changed).
    """

    __slots__ = ("_authorities", "_targets", "_verdicts", "clients", "guard", "sni_missing")

    def __init__(
        self, clients: ClientTable, guard: AddressGuard, sni_missing: SniMissing = "if-named"
    ) -> None:
        self.clients = clients
        self.guard = guard
        self.sni_missing: SniMissing = sni_missing
        self._verdicts: WeakKeyDictionary[Policy, dict[tuple[str, str, int], Decision]]
        self._verdicts = WeakKeyDictionary()
        self._targets: dict[str, tuple[Target, bool]] = {}
        self._authorities: dict[str, Target] = {}

    def set_guard(self, guard: AddressGuard) -> None:
        self.guard = guard
        self._verdicts.clear()

    def forget(self, policy: Policy) -> None:
        """Drop `policy`'s cached verdicts (a client's policy was replaced or removed)."""
        self._verdicts.pop(policy, None)

    # -- targets ------------------------------------------------------------------------------
    def connect_target(self, authority: str) -> Target | Verdict:
        """A CONNECT target, parsed once per distinct authority."""
        cached = self._authorities.get(authority)
        if cached is None:
            try:
                cached = parse_authority(authority)
            except TargetError as exc:
                return refuse_request(str(exc))
            if len(self._authorities) > CACHE_MAX:
                self._authorities.clear()
            self._authorities[authority] = cached
        return cached

    def request_target(self, raw: str) -> tuple[Target, str, bool] | Verdict:
        """An absolute-form target -> (target, path, explicit port); the authority's parse is
        cached (the path is not: it is per request)."""
        if raw[:7].lower() != "http://":
            return _form_refusal(raw)
        _, authority, path = split_url(raw)
        cached = self._targets.get(authority)
        if cached is None:
            try:
                cached = url_target("http", authority, "http://" + authority)
            except TargetError as exc:
                return refuse_request(str(exc))
            if len(self._targets) > CACHE_MAX:
                self._targets.clear()
            self._targets[authority] = cached
        return cached[0], path, cached[1]

    # -- identity -----------------------------------------------------------------------------
    def identify(
        self, bound: Identity | None, peer: object, head: RequestHead
    ) -> Identity | Verdict:
        """Who is asking: the listener's own client, else by token or source address (the
        credentials are looked up only when clients are configured: the hot path)."""
        if bound is not None:
            return bound
        clients = self.clients
        if clients.trivial:
            return clients.default
        return self.identify_credential(None, peer, head.get("proxy-authorization"))

    def identify_credential(
        self, bound: Identity | None, peer: object, authorization: str | None
    ) -> Identity | Verdict:
        """`identify` for a credential given as a `Proxy-Authorization` value (a SOCKS5
        username/password is presented as `Basic`: docs/proxy.md#transparent-mode-and-socks5)."""
        if bound is not None:
            return bound
        clients = self.clients
        if clients.trivial:
            return clients.default
        source = source_address(peer) if clients.by_source else None
        try:
            return clients.identify(source, authorization)
        except AuthError as exc:
            return Verdict(reason_of(exc.reason), str(exc), status=407)

    # -- verdicts -----------------------------------------------------------------------------
    def decide(self, policy: Policy, target: Target) -> Decision:
        """The verdict on the name (no addresses yet), cached per policy object."""
        per_policy = self._verdicts.get(policy)
        if per_policy is None:
            per_policy = self._verdicts[policy] = {}
        key = (target.scheme, target.host, target.port)
        decision = per_policy.get(key)
        if decision is None:
            decision = judge(policy, self.guard, target)
            if len(per_policy) > CACHE_MAX:
                per_policy.clear()
            per_policy[key] = decision
        return decision

    def admit(
        self, policy: Policy, target: Target, first: Decision, addrs: tuple[IPAddress, ...] = ()
    ) -> Admit | Verdict:
        """The final verdict given the name's verdict `first` and, for a name, its addresses.

        An IP literal was fully judged by `first` (its address is the target) and a framework
        route is exempt from the guard, so neither is judged again; a name is re-judged on
        its resolved addresses (address rules, the guard)."""
        decision = first
        if addrs and target.ip is None and first.reason != _FRAMEWORK_ROUTE:
            decision = judge(policy, self.guard, target, addrs)
        if not decision.allowed:
            return Verdict(reason_of(decision.reason), decision.detail, decision.rule)
        if decision.would is not None:
            return Admit(decision.reason, decision.rule, decision.would, decision.detail)
        return Admit(decision.reason, decision.rule)

    def refuse_early(self, decision: Decision) -> Verdict | None:
        """A verdict on the name that no address can change: refuse before any DNS."""
        if decision.allowed or decision.needs_addrs:
            return None
        return Verdict(reason_of(decision.reason), decision.detail, decision.rule)

    # -- a DNS query (transparent mode's responder) ---------------------------------------------
    def lookup(self, policy: Policy, name: str) -> Admit | Verdict:
        """A DNS query for `name` (normalized): answered when some connection to it may be
        allowed; an address spelling is no name (docs/proxy.md#transparent-mode-and-socks5).
        Under report-only a refused name is answered, and the record says it would not be."""
        if parse_ip_literal(name) is not None:
            return Verdict(Reason.NOT_A_NAME, "an address spelling is not a name")
        decision = judge_name(policy, name, self.guard)
        if decision.allowed:
            return Admit(decision.reason, decision.rule)
        if not policy.report_only:
            return Verdict(reason_of(decision.reason), decision.detail, decision.rule)
        would = f"report-only, would block: {decision.detail}"
        return Admit(decision.reason, decision.rule, "block", would)

    # -- TLS SNI of a tunnel -------------------------------------------------------------------
    @staticmethod
    def wants_sni(policy: Policy, target: Target) -> bool:
        """Check the ClientHello on 443 (unless a framework route) and on `https://` ports."""
        if target.port == 443:
            return policy.framework_route(target.host, target.port) is None
        return target.port in policy.https_ports

    def sni(
        self, policy: Policy, target: Target, admitted: Admit, hello: ClientHelloResult | None
    ) -> Admit | Verdict:
        """The verdict on a tunnel's first bytes (docs/proxy.md#tls-sni-check)."""
        if hello is not None and hello.kind == "malformed":
            return Verdict(Reason.SNI_MISMATCH, "malformed TLS ClientHello")
        if hello is None or hello.kind != "tls" or hello.sni is None:
            if self._sni_missing_ok(target, admitted):
                return admitted
            kind = "no ClientHello" if hello is None else f"{hello.kind} first bytes"
            if hello is not None and hello.kind == "tls":
                kind = "a ClientHello without SNI"
            return Verdict(
                Reason.SNI_MISSING, f"tunnel carried {kind}; policy requires SNI", status=403
            )
        if hello.sni == target.host:
            return admitted
        try:
            sni_target = parse_authority(f"{hello.sni}:{target.port}")
        except TargetError:
            return Verdict(Reason.SNI_MISMATCH, f"invalid SNI {hello.sni!r}")
        verdict = policy.decide(sni_target)
        if verdict.allowed:
            return admitted
        return Verdict(
            Reason.SNI_MISMATCH,
            f"SNI {hello.sni!r} not allowed on port {target.port} ({verdict.reason})",
            verdict.rule,
        )

    def _sni_missing_ok(self, target: Target, admitted: Admit) -> bool:
        if self.sni_missing == "allow":
            return True
        if self.sni_missing == "deny":
            return False
        return target.ip is None and admitted.reason in _NAMED_ALLOWS


_NAMED_ALLOWS: Final = frozenset({"allow_rule", "default_allow", "framework_route"})
_FRAMEWORK_ROUTE: Final = Reason.FRAMEWORK_ROUTE.value  # a plain str: compared per request


def _form_refusal(raw: str) -> Verdict:
    """The refusal of a non-http:// absolute target; ws:// and wss:// name the destination
    in the record (docs/proxy.md#websocket)."""
    refusal = refuse_request(_form_error(raw))
    scheme = raw.split("://", 1)[0].lower() if "://" in raw[:7] else ""
    if scheme not in ("ws", "wss"):
        return refusal
    try:
        _, authority, _ = split_url(raw)
        target, explicit = url_target("http", authority, "http://" + authority)
    except TargetError:
        return refusal
    port = target.port if explicit else (443 if scheme == "wss" else 80)
    return replace(refusal, where=(target.host, port))


def _form_error(target: str) -> str:
    if target.startswith("/"):
        return "origin-form request: this is a forward proxy, send absolute-form (http://host/)"
    if target == "*":
        return "asterisk-form request is not supported by a forward proxy"
    if target.lower().startswith("https://"):
        return "absolute-form https:// request: use CONNECT for TLS"
    if target[:5].lower() == "ws://" or target[:6].lower() == "wss://":
        return (
            "WebSocket over plain HTTP through the proxy is not supported: use wss:// "
            "(the client tunnels it with CONNECT), or reach ws:// without the proxy"
        )
    return f"unsupported request target {target[:100]!r}"


__all__ = [
    "HEAD_TIMEOUT",
    "Admit",
    "Gate",
    "SniMissing",
    "Verdict",
    "admit_client",
    "admit_connection",
    "keep_alive_after",
    "refuse_dial",
    "refuse_head",
    "refuse_request",
    "refuse_resolve",
    "refuse_upstream",
    "response_step",
]
