"""Workers of a fleet of models: each announces the model it serves and takes only that model's
work (and work that names none); a dead worker's work goes back to its own model's stream; a
request's stop sequences reach the engine; the default served name comes from the model."""

from __future__ import annotations

import json
import time
from argparse import Namespace

from contract import protocol, transitions
from contract.protocol import WorkItem
from devstack.stack import app_processes, embedding_on_fleet, settings_env
from tests.worker.conftest import eventually, final_of
from worker.__main__ import build_parser, engine_options, model_name_from, served_model_name
from worker.engines.simulated import SimulatedEngine


async def submit(
    client,
    keys,
    request_id: str,
    *,
    model: str,
    stream: str | None = None,
    stop: list[str] | None = None,
) -> None:
    item = WorkItem(
        id=request_id,
        user_id="7",
        conversation_id="",
        max_tokens=5,
        kind="api",
        messages=[{"role": "user", "content": "Hi"}],
        model=model,
        stop=stop or [],
    )
    pipe = client.pipeline(transaction=False)
    transitions.submitted(
        pipe,
        keys,
        item,
        citations=[],
        stream=stream or keys.work_for_model(model),
        submit_by_ms=protocol.now_ms() + 5000,
    )
    await pipe.execute()


async def worker_of(client, keys, request_id: str) -> str:
    events = [f for _, f in await client.xrange(keys.output(request_id))]
    return next(e["worker"] for e in events if e["type"] == "start")


async def test_each_worker_takes_only_its_own_models_work(run_worker, keys, redis_async):
    await run_worker("wa", model="alpha")
    await run_worker("wb", model="beta")
    for n in range(4):
        await submit(redis_async, keys, f"a{n}", model="alpha")
        await submit(redis_async, keys, f"b{n}", model="beta")
    await submit(redis_async, keys, "any", model="", stream=keys.work)  # names no model
    for n in range(4):
        assert (await final_of(redis_async, keys, f"a{n}"))["state"] == "done"
        assert (await final_of(redis_async, keys, f"b{n}"))["state"] == "done"
        assert await worker_of(redis_async, keys, f"a{n}") == "wa"
        assert await worker_of(redis_async, keys, f"b{n}") == "wb"
    assert (await final_of(redis_async, keys, "any"))["state"] == "done"
    # Nothing was read by a worker of the other model: every stream is empty.
    for stream in (keys.work_for_model("alpha"), keys.work_for_model("beta"), keys.work):
        assert await redis_async.xlen(stream) == 0


async def test_the_heartbeat_announces_the_model_and_it_is_remembered(
    run_worker, keys, redis_async
):
    await run_worker("wa", model="alpha")
    beat = await eventually(lambda: redis_async.get(keys.heartbeat("wa")), what="a heartbeat")
    assert json.loads(beat)["model"] == "alpha"
    seen = await redis_async.hget(keys.models, "alpha")
    assert 0 < int(seen) <= protocol.now_ms()


async def test_the_heartbeat_reports_the_models_context_window(run_worker, keys, redis_async):
    await run_worker("wa", model="alpha", engine=SimulatedEngine(context_tokens=32768))
    await run_worker("wb", model="beta", engine=SimulatedEngine())  # a window it cannot know
    beats = {}
    for worker_id in ("wa", "wb"):
        raw = await eventually(lambda w=worker_id: redis_async.get(keys.heartbeat(w)), what="beat")
        beats[worker_id] = json.loads(raw)
    assert beats["wa"]["context_tokens"] == 32768
    assert beats["wb"]["context_tokens"] is None  # the web then uses MODEL_CONTEXT_TOKENS


async def test_an_operators_prompt_window_below_the_engines_is_what_the_heartbeat_reports(
    run_worker, keys, redis_async
):
    engine = SimulatedEngine(context_tokens=32768)
    await run_worker("wa", model="alpha", engine=engine, prompt_window=4096)
    await run_worker("wb", model="beta", engine=SimulatedEngine(), prompt_window=4096)
    await run_worker(
        "wc", model="gamma", engine=SimulatedEngine(context_tokens=2048), prompt_window=4096
    )  # never above what the engine holds
    reported = {}
    for worker_id in ("wa", "wb", "wc"):
        raw = await eventually(lambda w=worker_id: redis_async.get(keys.heartbeat(w)), what="beat")
        reported[worker_id] = json.loads(raw)["context_tokens"]
    assert reported == {"wa": 4096, "wb": 4096, "wc": 2048}
    assert build_parser().parse_args(["--prompt-window", "240"]).prompt_window == 240


def test_the_openai_engine_is_told_its_window_by_a_flag():
    parse = build_parser().parse_args
    upstream = ["--engine", "openai", "--model", "m", "--base-url", "http://gpu:8000/v1"]
    told = engine_options(parse([*upstream, "--context-tokens", "32768"]))
    assert told["context_tokens"] == 32768
    assert engine_options(parse(upstream))["context_tokens"] is None
    simulated = engine_options(parse(["--engine", "simulated", "--sim-context-tokens", "4096"]))
    assert simulated["context_tokens"] == 4096


async def test_a_dead_workers_routed_work_goes_back_to_its_models_stream(
    run_worker, keys, redis_async
):
    private = keys.work_for("gone")
    await submit(redis_async, keys, "b1", model="beta", stream=private)
    await redis_async.zadd(keys.workers, {"gone": time.time() - 120})  # silent for 2 minutes
    await run_worker("wa", model="alpha")  # finds the dead worker first, or not: either way
    await run_worker("wb", model="beta")  # only a beta worker may run it
    assert (await final_of(redis_async, keys, "b1"))["state"] == "done"
    assert await worker_of(redis_async, keys, "b1") == "wb"


async def test_a_requests_stop_sequences_end_its_answer(run_worker, keys, redis_async):
    await run_worker("wa", model="alpha")
    await submit(redis_async, keys, "s1", model="alpha", stop=["tok2"])
    final = await final_of(redis_async, keys, "s1")
    assert final["text"] == "tok0 tok1 "
    assert final["finish_reason"] == "stop"


def test_the_served_name_defaults_to_the_models_name():
    assert model_name_from("/m/SmolLM2-135M-Instruct.Q4_1.gguf") == "smollm2-135m-instruct"
    assert model_name_from("HuggingFaceTB/SmolLM2-135M-Instruct") == "smollm2-135m-instruct"
    assert model_name_from("/m/Qwen2.5-0.5B-Instruct-Q4_K_M.gguf") == "qwen2.5-0.5b-instruct"
    assert model_name_from("var/models/Llama-3.2-1B-Instruct/") == "llama-3.2-1b-instruct"
    parse = build_parser().parse_args
    assert served_model_name(parse(["--engine", "llamacpp"])) == "smollm2-135m-instruct"
    assert served_model_name(parse(["--engine", "simulated"])) == "simulated"
    upstream = parse(["--engine", "openai", "--model", "gpt-4o-mini", "--base-url", "x"])
    assert served_model_name(upstream) == "gpt-4o-mini"
    named = Namespace(**{**vars(upstream), "served_model_name": " second "})
    assert served_model_name(named) == "second"


def test_make_run_can_start_a_second_worker_serving_another_name():
    assert [name for name, _ in app_processes({})] == ["web", "dispatcher", "worker"]
    processes = dict(app_processes({"SLUICE_SECOND_MODEL": "second"}))
    assert processes["worker-2"][-2:] == ["--served-model-name", "second"]
    assert "--served-model-name" not in processes["worker"]
    other = dict(
        app_processes({"SLUICE_SECOND_MODEL": "qwen", "SLUICE_SECOND_MODEL_FILE": "/m/q.gguf"})
    )
    assert other["worker-2"][-4:] == ["--served-model-name", "qwen", "--model", "/m/q.gguf"]


def test_make_run_starts_an_embedding_worker_when_retrieval_is_on_the_fleet():
    assert "embedder" not in dict(app_processes({"RAG_EMBEDDING_SERVING": "local"}))
    processes = dict(app_processes({"RAG_EMBEDDING_SERVING": "fleet"}))
    assert processes["embedder"][-3:] == ["-m", "worker", "embed"]


def test_the_runners_read_the_settings_env_file_under_the_environment(tmp_path):
    dotenv = tmp_path / ".env"
    assert settings_env({"A": "1"}, dotenv) == {"A": "1"}  # no .env
    dotenv.write_text("RAG_EMBEDDING_SERVING=fleet\nA=2\n")
    env = settings_env({"A": "1"}, dotenv)
    assert env == {"A": "1", "RAG_EMBEDDING_SERVING": "fleet"}  # the environment wins
    assert embedding_on_fleet(env)
