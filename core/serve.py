"""daphne on uvloop: `python -m core.serve` takes daphne's own arguments.

daphne runs Twisted's asyncio reactor on a loop it makes when its server module is imported,
with whatever event-loop policy is set then. Set to uvloop's first, the web process's event loop
(every websocket frame, every relayed answer, the output hub's reads) runs in C instead of
asyncio's pure-Python selector loop.
"""

from __future__ import annotations

import asyncio
import os

import uvloop

os.environ.setdefault("SLUICE_PROCESS", "web")  # the logs' `process` field
asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())

from daphne.cli import CommandLineInterface  # noqa: E402  (after the policy, see above)

if __name__ == "__main__":
    CommandLineInterface.entrypoint()
