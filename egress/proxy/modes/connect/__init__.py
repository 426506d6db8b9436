"""The CONNECT mode: its answers (`front`, pure) and its request head into an exchange (`serve`)."""
