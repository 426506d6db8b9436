"""The forwarder mode: its answers (`front`, pure) and its framework-route relay (`serve`)."""
