"""Run pproxy's CLI on uvloop (default) or on the stock asyncio loop (`--stock-asyncio`).

pproxy 2.7.9 calls ``uvloop.install()`` and then ``asyncio.get_event_loop()``; with
uvloop >= 0.22 the fresh policy has no current loop and pproxy dies with "There is no current
event loop". So: create the loop first, make it current, and turn pproxy's install() into a
no-op. With `--stock-asyncio` (first argument) uvloop is hidden from pproxy, which then keeps
asyncio's own loop. Other arguments are pproxy's own (``-l http://127.0.0.1:PORT -b REGEX``).
"""

import asyncio
import sys


def main() -> None:
    stock = sys.argv[1:2] == ["--stock-asyncio"]
    if stock:
        del sys.argv[1]
        sys.modules["uvloop"] = None  # type: ignore[assignment]  # pproxy's import fails
    else:
        import uvloop

        asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
        uvloop.install = lambda: None
    asyncio.set_event_loop(asyncio.new_event_loop())
    from pproxy import server  # type: ignore[import-untyped]

    sys.argv[0] = "pproxy"
    server.main()


if __name__ == "__main__":
    main()
