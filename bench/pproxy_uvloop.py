"""Run pproxy's CLI on uvloop.

pproxy 2.7.9 calls ``uvloop.install()`` and then ``asyncio.get_event_loop()``; with
uvloop >= 0.22 the fresh policy has no current loop and pproxy dies with "There is no current
event loop". So: create the uvloop loop first, make it current, and turn pproxy's install()
into a no-op. Arguments are pproxy's own (``-l http://127.0.0.1:PORT -b REGEX``).
"""

import asyncio
import sys

import uvloop


def main() -> None:
    asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
    asyncio.set_event_loop(asyncio.new_event_loop())
    uvloop.install = lambda: None
    from pproxy import server  # type: ignore[import-untyped]

    sys.argv[0] = "pproxy"
    server.main()


if __name__ == "__main__":
    main()
