"""The I/O shell: listeners, connections, relays, the upstream pool, resolution, netns."""
