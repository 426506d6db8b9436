"""Listener modes: one module per mode (its handshake and connection), the answers in `kinds`."""
