"""daphne on uvloop: `python -m core.serve` takes daphne's own arguments.

daphne runs Twisted's asyncio reactor on a loop it makes when its server module is imported,
with whatever event-loop policy is set then. Set to uvloop's first, the web process's event loop
(every websocket frame, every relayed answer, the output hub's reads) runs in C instead of
asyncio's pure-Python selector loop.
"""

from __future__ import annotations

import asyncio
import os
import sys

import uvloop

os.environ.setdefault("SLUICE_PROCESS", "web")  # the logs' `process` field
asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
# The web's pool threads (a question's database and Redis round trips) share the interpreter's
# lock with the loop that relays every answer. A thread back from a round trip waits for the
# loop to give the lock up, at most this long: at Python's 5 ms default, paid on each round trip
# while the loop is busy, a question's submit waited on the relay of other people's answers.
sys.setswitchinterval(0.0005)

from daphne.cli import CommandLineInterface  # noqa: E402  (after the policy, see above)

if __name__ == "__main__":
    CommandLineInterface.entrypoint()
