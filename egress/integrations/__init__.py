"""egress inside evaluation frameworks: one module per framework (docs/integrations.md)."""

# - `egress.integrations.verifiers`: a docker runtime for verifiers 0.4 whose
#   `prepare_execution(routes)` cuts the sandbox and serves the agent's proxy from here
#   (`pip install 'egress-netcut[verifiers]'`).
# - `egress.integrations.inspect`: an inspect-ai sandbox extension that wraps another sandbox,
#   lets setup run online and cuts before the solver (`[inspect]`).
# - `egress.integrations.harbor`: a harbor environment mixin for its network policy (`[harbor]`).
# - `vf_runtime` (verifiers' `NamespaceRuntime`), `vf_hook` (`install()`: verifiers' own config
#   builds egress's runtimes) and `netns_sandbox` (inspect's `egress-netns` sandbox), public
#   through the framework's module (docs/integrations.md).
#
# Each framework is imported only by its own module, and only when that module is imported:
# importing `egress` or this package never imports a framework. What they share lives in
# `egress` itself: `shared_proxy()` (one proxy per event loop, since framework factories take
# no arguments), `plan_execution()` (the agent's URLs and environment before the cut),
# `client_id_from()` (the framework's run or sample id as the audit's `client_id`) and
# `from_verifiers` / `from_harbor` (their policies, decided exactly as they decide them).

from __future__ import annotations

from .shared import close_shared_proxy, configure_shared_proxy, shared_proxy

__all__ = ["close_shared_proxy", "configure_shared_proxy", "shared_proxy"]
