"""The HTTP forward mode: its answers (`front`, pure) and its requests (`serve`)."""
