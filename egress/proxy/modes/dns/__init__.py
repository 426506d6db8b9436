"""The DNS mode: its answers by rcode (`front`, pure) and the responder's sockets (`serve`)."""
