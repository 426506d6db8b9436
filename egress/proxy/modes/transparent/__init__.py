"""The transparent mode: its answers (`front`, pure) and a redirected connection (`serve`)."""
