"""`Delegated`: a public method of `EgressProxy` that is one of its components', in one line.

Pure (no I/O). `EgressProxy` (`server.py`) is the one object users hold, and most of its
public API is the work of a component (`tenants`, `endpoints`, `insight`:
docs/architecture.md#egress-who-owns-what). A delegating method written out repeats the
component's signature and body; `add_client = Delegated("tenants",
ClientControl.add_client)` says the same once: on an instance it is the component's bound
method (same signature, same docstring, a coroutine where the component's is one), on the
class a function that takes the proxy first (a coroutine function where the component's is
one), so `EgressProxy.add_client(proxy, spec)` and `help(EgressProxy)` read as before. The
method is documented where it is written, in the component.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import Any, Concatenate, Generic, ParamSpec, TypeVar, overload

P = ParamSpec("P")
R = TypeVar("R")


class Delegated(Generic[P, R]):
    """The method `method` of the component held in the attribute `component`."""

    __slots__ = ("component", "method", "name")

    def __init__(self, component: str, method: Callable[Concatenate[Any, P], R]) -> None:
        self.component = component
        self.method = method
        self.name: str = getattr(method, "__name__", "")

    @overload
    def __get__(
        self, owner_self: None, owner: type | None = None
    ) -> Callable[Concatenate[Any, P], R]: ...

    @overload
    def __get__(self, owner_self: object, owner: type | None = None) -> Callable[P, R]: ...

    def __get__(self, owner_self: object, owner: type | None = None) -> Callable[..., R]:
        if owner_self is None:
            return self.unbound()
        bound: Callable[P, R] = getattr(getattr(owner_self, self.component), self.name)
        return bound

    def unbound(self) -> Callable[Concatenate[Any, P], R]:
        """The method as the class shows it: takes the proxy, then the component's arguments."""
        component, name = self.component, self.name

        def through(holder: Any, *args: P.args, **kwargs: P.kwargs) -> R:
            method: Callable[P, R] = getattr(getattr(holder, component), name)
            return method(*args, **kwargs)

        async def awaited(holder: Any, *args: P.args, **kwargs: P.kwargs) -> Any:
            return await through(holder, *args, **kwargs)  # type: ignore[misc]

        chosen = awaited if inspect.iscoroutinefunction(self.method) else through
        return functools.wraps(self.method)(chosen)  # type: ignore[return-value]


__all__ = ["Delegated"]
