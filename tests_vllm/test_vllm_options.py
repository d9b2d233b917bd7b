"""The vllm knobs of `python -m worker`, from the command line or the environment."""

from __future__ import annotations

import json

import pytest

from worker.__main__ import build_parser, engine_options


def options(argv: list[str]) -> dict:
    return engine_options(build_parser().parse_args(["--engine", "vllm", *argv]))


def test_command_line_knobs_reach_the_engine(tmp_path):
    got = options(
        [
            "--model",
            "Qwen/Qwen2.5-7B-Instruct",
            "--max-model-len",
            "8192",
            "--gpu-memory-utilization",
            "0.8",
            "--tensor-parallel-size",
            "2",
            "--enforce-eager",
            "--max-num-seqs",
            "64",
            "--kv-cache-gib",
            "20",
            "--vllm-engine-args",
            '{"kv_cache_dtype": "fp8"}',
            "--tool-call-parser",
            "llama3_json",
        ]
    )
    assert got == {
        "model": "Qwen/Qwen2.5-7B-Instruct",
        "max_model_len": 8192,
        "gpu_memory_utilization": 0.8,
        "tensor_parallel_size": 2,
        "enforce_eager": True,
        "max_num_seqs": 64,
        "dtype": "auto",
        "kv_cache_gib": 20.0,
        "engine_args": {"kv_cache_dtype": "fp8"},
        "exit_on_engine_death": True,
        "tool_call_parser": "llama3_json",
    }


def test_environment_knobs_reach_the_engine(monkeypatch):
    monkeypatch.setenv("WORKER_MODEL", "/models/llama")
    monkeypatch.setenv("WORKER_VLLM_TENSOR_PARALLEL_SIZE", "4")
    monkeypatch.setenv("WORKER_VLLM_ENFORCE_EAGER", "true")
    monkeypatch.setenv("WORKER_VLLM_MAX_MODEL_LEN", "4096")
    monkeypatch.setenv("WORKER_VLLM_ENGINE_ARGS", json.dumps({"quantization": "fp8"}))
    monkeypatch.setenv("WORKER_VLLM_TOOL_CALL_PARSER", "hermes")
    got = options([])
    assert (got["model"], got["tensor_parallel_size"], got["enforce_eager"]) == (
        "/models/llama",
        4,
        True,
    )
    assert got["max_model_len"] == 4096 and got["engine_args"] == {"quantization": "fp8"}
    assert got["tool_call_parser"] == "hermes"


def test_slots_size_the_engine_unless_max_num_seqs_is_given():
    assert options(["--model", "m", "--slots", "3"])["max_num_seqs"] == 3
    assert options(["--model", "m", "--slots", "3", "--max-num-seqs", "5"])["max_num_seqs"] == 5
    assert options(["--model", "m"])["max_num_seqs"] is None  # vLLM's default


def test_a_prepared_folder_runs_in_the_dtype_it_was_written_in(tmp_path):
    (tmp_path / "sluice-prepared.json").write_text(json.dumps({"dtype": "float32"}))
    assert options(["--model", str(tmp_path)])["dtype"] == "float32"
    assert options(["--model", str(tmp_path), "--dtype", "bfloat16"])["dtype"] == "bfloat16"


def test_no_model_and_nothing_prepared_says_what_to_run(monkeypatch, tmp_path):
    monkeypatch.setenv("SLUICE_VAR_DIR", str(tmp_path))
    monkeypatch.delenv("WORKER_MODEL", raising=False)
    with pytest.raises(SystemExit, match="prepare-model"):
        options([])
