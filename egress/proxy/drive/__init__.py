"""Drivers of an exchange's actions: a coroutine, protocol callbacks, and the relay both share."""
