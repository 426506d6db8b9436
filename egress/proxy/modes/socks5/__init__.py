"""The SOCKS5 mode: its answers and handshake (`front`, pure) and its connection (`serve`)."""
