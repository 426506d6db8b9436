"""The DNS mode: its answers (`front`), a query's exchange (`query`), its sockets (`serve`)."""
