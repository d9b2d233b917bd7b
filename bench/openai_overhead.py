"""What Sluice adds to an OpenAI-compatible stream: a mock OpenAI upstream (first token after
50 ms, then 100 tokens 10 ms apart) driven directly, and the same upstream behind Sluice (its
`openai` engine in a worker, the dispatcher, the web's /v1/chat/completions), by the same
client code, side by side in one run at 1, 10 and 100 concurrent streams. Each level also
prints the CPU every Sluice process spent per answer (web, dispatcher, worker, Redis,
PostgreSQL, read from /proc around the Sluice rounds; the mock and the clients not counted).

    .venv/bin/python bench/openai_overhead.py [--clients 1,10,100] [--seconds 8] [--rounds 2]
                                              [--ramp 1] [--modes plain,tools,json]

--ramp starts the clients one after another over that many seconds, on both sides (by default
all at once: the first hundred requests queue behind one another, which sets the p99).

--modes: the kinds of request each level runs, taking turns in every round: `plain` chat,
`tools` (a function tool, `tool_choice: required`: the mock streams one call, its arguments in
100 pieces) and `json` (`response_format` json_schema, strict: a JSON object in 100 pieces). The
mock answers each with the same timing and token count, so the rows differ only by what Sluice
does with the kind: checking the tools or schema, carrying them on, gathering a call's deltas.

The clients are closed loops (a stream, then the next as soon as it ends) speaking raw HTTP/1.1
over keep-alive connections, so the client's own CPU stays small on a machine it shares.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
import time

from harness import (
    BASE_DIR,
    Timings,
    cpu_per_answer,
    median,
    percentile,
    print_row,
    ramp_delay,
    say,
    setup_django,
    sluice,
    wait_for_port,
)

from devstack.stack import free_port

FIRST_TOKEN_MS, DECODE_MS, TOKENS = 50, 10, 100
MODEL = "mock-model"
WORDS = {
    "type": "object",
    "properties": {"words": {"type": "array", "items": {"type": "string"}}},
    "required": ["words"],
}
TOOL = {"type": "function", "function": {"name": "record_words", "parameters": WORDS}}
SCHEMA = {"name": "words", "strict": True, "schema": {**WORDS, "additionalProperties": False}}
# What each kind of request adds to the plain one. A call or a JSON object ends when the
# upstream ends it, a token inside Sluice's cap: cut at the cap, a call would be dropped whole
# (only a finished call is sent).
MODES = {
    "plain": {},
    "tools": {"tools": [TOOL], "tool_choice": "required", "max_tokens": TOKENS + 1},
    "json": {
        "response_format": {"type": "json_schema", "json_schema": SCHEMA},
        "max_tokens": TOKENS + 1,
    },
}


# -- the mock upstream (its own process: `--serve-mock PORT`) ----------------------------------


def _json(value) -> bytes:
    return json.dumps(value, separators=(",", ":")).encode()  # as OpenAI's API writes it


def _chunk(payload: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(payload), payload)


async def _mock_stream(writer: asyncio.StreamWriter, body: dict) -> None:
    count = min(TOKENS, int(body.get("max_tokens") or TOKENS))
    head = {"id": "chatcmpl-mock", "object": "chat.completion.chunk", "created": 0, "model": MODEL}
    writer.write(
        b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
    )
    start = time.perf_counter()
    pieces = _pieces(body, count)
    for i, delta in enumerate(pieces):
        deadline = start + (FIRST_TOKEN_MS + i * DECODE_MS) / 1000
        delay = deadline - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        chunk = {**head, "choices": [{"index": 0, "delta": delta, "finish_reason": None}]}
        writer.write(_chunk(b"data: " + _json(chunk) + b"\n\n"))
    reason = "stop" if body.get("response_format") else "length"  # plain text: cut at the cap
    reason = "tool_calls" if body.get("tools") else reason
    end = {**head, "choices": [{"index": 0, "delta": {}, "finish_reason": reason}]}
    usage = {**head, "choices": [], "usage": {"prompt_tokens": 10, "completion_tokens": count}}
    tail = b"data: %s\n\ndata: %s\n\ndata: [DONE]\n\n" % (_json(end), _json(usage))
    writer.write(_chunk(tail) + b"0\r\n\r\n")
    await writer.drain()


def _pieces(body: dict, count: int) -> list[dict]:
    """The `count` deltas of an answer: text; or one call of the request's tool, its arguments
    in pieces (as an upstream that enforces a tool's schema streams it); or a JSON object the
    response format's schema allows, in pieces."""
    if not body.get("tools") and not body.get("response_format"):
        return [{"content": f" tok{i}"} for i in range(count)]
    words = [f'"tok{i}",' for i in range(count - 2)]
    pieces = ['{"words": [', *words[:-1], words[-1].rstrip(","), "]}"]
    if body.get("response_format"):
        return [{"content": piece} for piece in pieces]
    name = body["tools"][0]["function"]["name"]
    call = {"index": 0, "id": "call_mock", "type": "function"}
    return [
        {"tool_calls": [{**call, "function": {"name": name, "arguments": pieces[0]}}]},
        *({"tool_calls": [{"index": 0, "function": {"arguments": p}}]} for p in pieces[1:]),
    ]


async def _mock_connection(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while True:
            head = await reader.readuntil(b"\r\n\r\n")
            request_line, *lines = head.decode("latin-1").split("\r\n")
            headers = dict(line.lower().split(": ", 1) for line in lines if ": " in line)
            raw = await reader.readexactly(int(headers.get("content-length", 0)))
            if request_line.startswith("GET"):  # /v1/models: the engine's health check
                data = json.dumps({"object": "list", "data": [{"id": MODEL}]}).encode()
                writer.write(
                    b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                    b"Content-Length: %d\r\n\r\n%s" % (len(data), data)
                )
            else:
                await _mock_stream(writer, json.loads(raw))
    except (asyncio.IncompleteReadError, ConnectionError):
        pass
    finally:
        writer.close()


async def serve_mock(port: int) -> None:
    server = await asyncio.start_server(_mock_connection, "127.0.0.1", port, backlog=1024)
    async with server:
        await server.serve_forever()


# -- the client: the same code for Sluice and for the mock -------------------------------------


async def _response_head(reader: asyncio.StreamReader) -> tuple[int, dict[str, str]]:
    head = await reader.readuntil(b"\r\n\r\n")
    status_line, *lines = head.decode("latin-1").split("\r\n")
    headers = dict(line.lower().split(": ", 1) for line in lines if ": " in line)
    return int(status_line.split()[1]), headers


async def _body_parts(reader: asyncio.StreamReader, headers: dict[str, str]):
    if headers.get("transfer-encoding") == "chunked":
        while True:
            size = int((await reader.readuntil(b"\r\n")).split(b";")[0], 16)
            if size == 0:
                await reader.readuntil(b"\r\n")
                return
            yield await reader.readexactly(size + 2)
    elif "content-length" in headers:
        yield await reader.readexactly(int(headers["content-length"]))
    else:
        yield await reader.read()


async def stream_client(
    host: str,
    port: int,
    *,
    key: str,
    until: float,
    timings: Timings,
    delay: float = 0.0,
    mode: str = "plain",
) -> None:
    """Streams completions back to back until `until`: time to the first text (or tool call),
    and to the end. `delay`: seconds to wait before connecting (a ramp, harness.ramp_delay)."""
    body = json.dumps(
        {
            "model": MODEL,
            "stream": True,
            "max_tokens": TOKENS,
            "messages": [{"role": "user", "content": "Tell me about rivers."}],
            **MODES[mode],
        }
    )
    request = (
        f"POST /v1/chat/completions HTTP/1.1\r\nHost: {host}:{port}\r\n"
        f"Authorization: Bearer {key}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n{body}"
    ).encode()
    await asyncio.sleep(delay)
    reader, writer = await asyncio.open_connection(host, port)
    try:
        while time.perf_counter() < until:
            sent = time.perf_counter()
            writer.write(request)
            status, headers = await _response_head(reader)
            first, done, buffer = None, False, b""
            async for part in _body_parts(reader, headers):
                if first is None:
                    buffer += part
                    text = b'"content":"' in buffer.replace(b'"content":""', b"")
                    if text or b'"tool_calls"' in buffer:
                        first = time.perf_counter()
                        buffer = b""
                done = done or b"data: [DONE]" in part
            if status != 200 or not done or first is None:
                timings.errors += 1
                await asyncio.sleep(0.05)
            else:
                timings.ttft.append((first - sent) * 1000)
                timings.completion.append((time.perf_counter() - sent) * 1000)
            if headers.get("connection") == "close":
                writer.close()
                reader, writer = await asyncio.open_connection(host, port)
    finally:
        writer.close()


async def run_level(
    port: int, keys: list[str], seconds: float, ramp: float = 0.0, mode: str = "plain"
) -> Timings:
    timings = Timings()
    until = time.perf_counter() + seconds
    await asyncio.gather(
        *(
            stream_client(
                "127.0.0.1",
                port,
                key=key,
                until=until,
                timings=timings,
                delay=ramp_delay(n, len(keys), ramp),
                mode=mode,
            )
            for n, key in enumerate(keys)
        )
    )
    return timings


def make_keys(count: int) -> list[str]:
    """`count` users with an API key each, on a plan that admits everything: the benchmark
    measures the request path, not the rate limits."""
    from django.contrib.auth.hashers import make_password

    from apps.accounts.models import User
    from apps.accounts.services import api_key_create
    from apps.admission.models import Plan

    Plan.objects.filter(is_default=True).update(
        requests_per_minute=1_000_000,
        burst_requests=1_000_000,
        tokens_per_minute=10**9,
        burst_tokens=10**9,
        tokens_per_day=10**9,
        max_concurrent=10_000,
    )
    hashed = make_password("bench-password-1")
    users = [User.objects.create(username=f"api{i}", password=hashed) for i in range(count)]
    return [api_key_create(user=user, name="bench")[1] for user in users]


def wait_for_model(base_url: str, key: str, timeout: float = 60) -> None:
    import httpx

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        listed = httpx.get(f"{base_url}/v1/models", headers={"Authorization": f"Bearer {key}"})
        if listed.status_code == 200 and any(m["id"] == MODEL for m in listed.json()["data"]):
            return
        time.sleep(0.3)
    raise RuntimeError(f"no worker announced {MODEL} within {timeout:.0f}s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--clients", default="1,10,100")
    parser.add_argument("--seconds", type=float, default=8.0, help="per round and side")
    parser.add_argument("--rounds", type=int, default=2, help="alternations of the two sides")
    parser.add_argument(
        "--ramp",
        type=float,
        default=0.0,
        metavar="SECONDS",
        help="the clients start one after another over this many seconds "
        "(both sides alike) instead of all at once",
    )
    parser.add_argument("--modes", default="plain,tools,json", help="plain, tools, json")
    parser.add_argument("--serve-mock", type=int, metavar="PORT", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve_mock:
        import uvloop

        uvloop.run(serve_mock(args.serve_mock))
        return
    levels = [int(c) for c in args.clients.split(",")]
    modes = [mode for mode in args.modes.split(",") if mode]
    if not modes or set(modes) - set(MODES):
        parser.error(f"--modes: choose among {', '.join(MODES)}")
    mock_port = free_port()
    mock = subprocess.Popen(
        [
            sys.executable,
            str(BASE_DIR / "bench" / "openai_overhead.py"),
            "--serve-mock",
            str(mock_port),
        ]
    )
    worker_args = [
        "--engine",
        "openai",
        "--base-url",
        f"http://127.0.0.1:{mock_port}/v1",
        "--model",
        MODEL,
        "--slots",
        str(max(levels) * 2),
    ]
    summary = {}
    try:
        wait_for_port(mock_port)
        with sluice(worker_args=worker_args) as running:
            setup_django()
            keys = make_keys(max(levels))
            wait_for_model(running.base_url, keys[0])
            sluice_port = int(running.base_url.rsplit(":", 1)[1])
            for clients in levels:
                found = compare(running, sluice_port, mock_port, keys[:clients], args, modes)
                summary.update({(clients, mode): row for mode, row in found.items()})
    finally:
        mock.terminate()
        mock.wait()

    top, low = max(levels), min(levels)
    first = modes[0]
    through, alone, cpu_ms = summary[top, first]
    ratio = len(through.completion) / max(1, len(alone.completion))
    ttft50 = median(through.ttft) - median(alone.ttft)
    ttft99 = percentile(through.ttft, 99) - percentile(alone.ttft, 99)
    one = median(summary[low, first][0].ttft) - median(summary[low, first][1].ttft)
    others = ", ".join(f"{mode} {summary[top, mode][2]:.1f}" for mode in modes[1:])
    print(
        f"openai: c={top} {ratio:.2f} of direct answers/s, ttft +{ttft50:.0f} ms p50 / "
        f"+{ttft99:.0f} ms p99, cpu {cpu_ms:.1f} ms/answer{f' ({others})' if others else ''}; "
        f"c={low} ttft +{one:.1f} ms" + ("" if first == "plain" else f" [{first}]")
    )


def compare(running, sluice_port: int, mock_port: int, keys: list[str], args, modes: list[str]):
    """One level, each kind of request through Sluice and direct; the kinds take turns within
    each of `args.rounds` rounds, so a load that drifts on a shared machine falls on all of
    them alike. mode -> (through, direct, CPU ms per answer across Sluice's processes)."""
    import uvloop

    clients = len(keys)
    through = {mode: Timings() for mode in modes}
    alone = {mode: Timings() for mode in modes}
    cpu: dict[str, dict[str, float]] = {mode: {} for mode in modes}
    for _ in range(args.rounds):
        for mode in modes:
            before, answered = running.cpu_seconds(), len(through[mode].completion)
            through[mode].extend(
                uvloop.run(run_level(sluice_port, keys, args.seconds, args.ramp, mode=mode))
            )
            done = len(through[mode].completion) - answered
            spent = cpu_per_answer(before, running.cpu_seconds(), done)
            for role, ms in spent.items():
                cpu[mode][role] = cpu[mode].get(role, 0) + ms / args.rounds
            alone[mode].extend(
                uvloop.run(run_level(mock_port, [""] * clients, args.seconds, args.ramp, mode=mode))
            )
    found = {}
    for mode in modes:
        seconds = args.seconds * args.rounds
        print_row(f"sluice {mode}", clients, through[mode], seconds)
        print_row(f"direct {mode}", clients, alone[mode], seconds)
        shares = ", ".join(f"{role} {ms:.2f} ms" for role, ms in sorted(cpu[mode].items()))
        say(f"  cpu per answer ({mode}): {shares} (total {sum(cpu[mode].values()):.2f} ms)")
        found[mode] = (through[mode], alone[mode], sum(cpu[mode].values()))
    return found


if __name__ == "__main__":
    main()
