"""The hash-chained audit log: its writer, format, verification, reports and CLI."""
