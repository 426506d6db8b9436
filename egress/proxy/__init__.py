"""The egress proxy: a pure core and codecs, front-end modes, and the I/O shell around them."""
