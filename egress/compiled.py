"""Which modules a compiled build compiles with mypyc, and which of them are compiled here.

The pure core of the request path (the HTTP/1.1 codec, the exchange, the gate, the record)
is ordinary typed Python; a wheel built with `EGRESS_MYPYC=1` compiles the modules below to
C extensions (docs/architecture.md#a-compiled-build). The pure-Python path stays the
default and behaves the same: the tests run against both. This list is the one place that
names them: `setup.py` reads it (without importing egress, so stdlib only here) and
`compiled_modules` checks it at run time.
"""

from __future__ import annotations

import importlib.util
from importlib.machinery import EXTENSION_SUFFIXES

# Dotted names of the modules that compile cleanly and measurably gain
# (docs/benchmarks.md#a-compiled-build): the head parsers and the request rewrite, the
# exchange (with its legal sequence, core/sequence.py), the gate and the record (a kept-alive
# request: -11 % instructions), and the ClientHello, chunked and SOCKS5 parsers (-51 %,
# -32 %, -21 % of their own instructions).
# Left out as measured: codec/http1 (re-exports only), core/actions, intent, kept and
# responses (a kept-alive request's instructions the same with and without them).
MODULES: tuple[str, ...] = (
    "egress.proxy.codec.chunked",
    "egress.proxy.codec.fields",
    "egress.proxy.codec.request",
    "egress.proxy.codec.response",
    "egress.proxy.codec.rewrite",
    "egress.proxy.codec.socks5",
    "egress.proxy.codec.tls_hello",
    "egress.proxy.core.exchange",
    "egress.proxy.core.gate",
    "egress.proxy.core.record",
    "egress.proxy.core.sequence",
)


def is_compiled(module: str) -> bool:
    """Whether `module` would be imported from a C extension (a mypyc build) rather than
    from its `.py` file; found without importing it."""
    spec = importlib.util.find_spec(module)
    origin = spec.origin if spec is not None else None
    return origin is not None and origin.endswith(tuple(EXTENSION_SUFFIXES))


def compiled_modules() -> tuple[str, ...]:
    """The modules of `MODULES` that this installation runs compiled: all of them in a
    wheel built with `EGRESS_MYPYC=1`, none in a plain (or editable) install."""
    return tuple(m for m in MODULES if is_compiled(m))
