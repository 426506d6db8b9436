"""egress: an in-process asyncio egress proxy with an audited allow/block policy."""

__all__: list[str] = []
