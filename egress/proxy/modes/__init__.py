"""Front-ends: each listener mode's handshake into an `Intent` and its answers by `Reason`."""
