"""The engine alone behind a bare websocket: the baseline Sluice's overhead is measured against.

It speaks the chat page's protocol (send → delta frames → final) and batches deltas as Sluice's
workers do (the first token at once, then at most one frame per 30 ms), so both sides send the
same number of frames.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from worker.engines.base import EngineRequest
from worker.engines.simulated import SimulatedEngine

BATCH_SECONDS = 0.03


async def serve(port: int, engine: SimulatedEngine) -> None:
    import websockets

    async def handle(ws):
        async for raw in ws:
            frame = json.loads(raw)
            request = EngineRequest(
                id=uuid.uuid4().hex,
                max_tokens=512,
                messages=[{"role": "user", "content": frame["text"]}],
            )
            parts, batch, last_sent = [], [], 0.0
            async for output in engine.generate(request):
                if not output.text:
                    continue
                batch.append(output.text)
                parts.append(output.text)
                if time.perf_counter() - last_sent >= BATCH_SECONDS:
                    await ws.send(json.dumps({"type": "delta", "text": "".join(batch)}))
                    batch.clear()
                    last_sent = time.perf_counter()
            if batch:
                await ws.send(json.dumps({"type": "delta", "text": "".join(batch)}))
            await ws.send(json.dumps({"type": "final", "state": "done", "text": "".join(parts)}))

    async with websockets.serve(handle, "127.0.0.1", port, max_size=None):
        await asyncio.Future()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--first-token-ms", type=float, default=50)
    parser.add_argument("--decode-ms", type=float, default=10)
    parser.add_argument("--tokens", type=int, default=100)
    args = parser.parse_args()
    engine = SimulatedEngine(
        slots=10_000,
        first_token_ms=args.first_token_ms,
        decode_ms_per_token=args.decode_ms,
        tokens=args.tokens,
    )
    asyncio.run(serve(args.port, engine))


if __name__ == "__main__":
    main()
