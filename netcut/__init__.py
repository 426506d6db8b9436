"""netcut: cut a network namespace down to loopback and a few kept addresses."""

__all__: list[str] = []
