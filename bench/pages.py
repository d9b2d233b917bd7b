"""What a page load costs the web: a logged-in user's chat page (a synchronous Django view, the
site's whole middleware chain), loaded --pages times by --concurrency clients at once, with the
web process's CPU read from /proc around the run.

    .venv/bin/python bench/pages.py [--pages 1000] [--concurrency 10]

Compare two trees by running it in each (a git worktree of the other). Prints figures; asserts
nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import time
from collections import Counter

import httpx
from harness import make_sessions, say, setup_django, sluice


async def load_pages(
    base_url: str, cookie: str, path: str, *, pages: int, concurrency: int
) -> Counter:
    """Loads `path` `pages` times, `concurrency` at once; the status codes seen."""
    statuses: Counter = Counter()
    left = iter(range(pages))
    async with httpx.AsyncClient(
        base_url=base_url, cookies={"sessionid": cookie}, timeout=30
    ) as client:

        async def one_client() -> None:
            for _ in left:
                statuses[(await client.get(path)).status_code] += 1

        await asyncio.gather(*(one_client() for _ in range(concurrency)))
    return statuses


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pages", type=int, default=1000)
    parser.add_argument("--concurrency", type=int, default=10)
    args = parser.parse_args()
    with sluice(worker_args=["--engine", "simulated", "--slots", "4"]) as running:
        setup_django()
        [(cookie, conversation)] = make_sessions(1)
        path = f"/c/{conversation}/"
        asyncio.run(load_pages(running.base_url, cookie, path, pages=50, concurrency=5))  # warm
        before, started = running.cpu_seconds(), time.perf_counter()
        statuses = asyncio.run(
            load_pages(
                running.base_url, cookie, path, pages=args.pages, concurrency=args.concurrency
            )
        )
        seconds = time.perf_counter() - started
        spent = running.cpu_seconds()
    web_ms = (spent["web"] - before["web"]) / args.pages * 1000
    say(f"statuses {dict(statuses)}")
    print(
        f"pages: {args.pages / seconds:.0f} pages/s at {args.concurrency} at once, "
        f"web cpu {web_ms:.2f} ms/page"
    )


if __name__ == "__main__":
    main()
