"""`egress serve`: run the proxy standalone (placeholder until the proxy lands)."""

from __future__ import annotations

import argparse

from .config import Settings


def add_serve_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--listen", action="append", default=[], metavar="HOST:PORT")
    p.add_argument("--audit-log", metavar="PATH|-")


def cmd_serve(args: argparse.Namespace, settings: Settings) -> int:
    raise NotImplementedError
