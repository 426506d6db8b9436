"""Sans-I/O codecs: bytes in, parsed messages out (HTTP/1, TLS, SOCKS5, DNS)."""
