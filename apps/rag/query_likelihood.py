"""A second-stage scorer from a causal language model: how likely the question is after the
passage.

A model that has read a passage and is asked to write a question it answers gives the user's
question a high likelihood when the passage answers it, whatever words either uses (unsupervised
passage reranking, Sachan et al. 2022, "Improving Passage Retrieval with Zero-Shot Question
Generation"). It needs no trained cross-encoder: any instruction-tuned GGUF works, the demo's
own SmolLM2-135M included. The score is the mean log-probability of the question's tokens, so a
long question is not penalised for its length.

It costs one forward pass over the passage and the question per pair: on two CPU cores about
0.45 s for a 130-token pair with SmolLM2-135M, so on a CPU it suits a few candidates (or a
machine with cores to spare); bench/rag.py --rerank-model prints its cost per question.
"""

from __future__ import annotations

import atexit
import threading
from collections import OrderedDict
from pathlib import Path

import numpy as np

INSTRUCTION = "Read the passage and write a question it answers.\n\nPassage:\n"
ANSWER_CUE = "Question:"
CONTEXT_TOKENS = 512  # passage, instruction and question; a longer passage is cut
QUESTION_TOKENS = 96  # a longer question is scored by its first tokens
SCORES_KEPT = 4096  # (question, passage) scores remembered per model


class QueryLikelihood:
    """One llama.cpp model, used by one thread at a time (a llama.cpp context is not thread-safe;
    the lock serialises the scoring of one process)."""

    def __init__(self, path: str, *, threads: int | None = None):
        from llama_cpp import Llama

        if not Path(path).is_file():
            raise FileNotFoundError(f"RAG_RERANK_MODEL: no GGUF file at {path}")
        self._llm = Llama(
            model_path=path,
            n_ctx=CONTEXT_TOKENS,
            n_batch=CONTEXT_TOKENS,
            n_threads=threads,
            logits_all=True,
            verbose=False,
        )
        # Freed before the interpreter's teardown, which would leave llama.cpp's own cleanup
        # without the functions it calls (a TypeError printed at every exit).
        atexit.register(self._llm.close)
        self._lock = threading.Lock()
        self._scores: OrderedDict[tuple[str, str], float] = OrderedDict()
        before, after = self._frame()
        self._prefix = self._tokens(before, special=True)
        self._suffix = self._tokens(after, special=True)

    def score(self, question: str, passages: list[str]) -> list[float]:
        """The mean log-probability of `question` after each passage (higher is better)."""
        with self._lock:
            return [self._score(question, passage) for passage in passages]

    def _score(self, question: str, passage: str) -> float:
        key = (question, passage)
        if key in self._scores:
            self._scores.move_to_end(key)
            return self._scores[key]
        asked = self._tokens(" " + question.strip())[:QUESTION_TOKENS]
        room = CONTEXT_TOKENS - len(self._prefix) - len(self._suffix) - len(asked)
        read = self._tokens(passage)[: max(room, 0)]
        tokens = self._prefix + read + self._suffix + asked
        llm = self._llm
        # The instruction is the same for every pair: its keys and values stay in the cache.
        shared = (
            len(self._prefix) if list(llm.input_ids[: len(self._prefix)]) == self._prefix else 0
        )
        llm.n_tokens = min(llm.n_tokens, shared)
        llm.eval(tokens[llm.n_tokens :])
        # Row i of the scores predicts token i + 1.
        first = len(tokens) - len(asked)
        rows = np.asarray(llm.scores[first - 1 : len(tokens) - 1], dtype=np.float64)
        log_probs = rows - np.logaddexp.reduce(rows, axis=1, keepdims=True)
        value = float(log_probs[np.arange(len(asked)), asked].mean())
        self._scores[key] = value
        if len(self._scores) > SCORES_KEPT:
            self._scores.popitem(last=False)
        return value

    def _tokens(self, text: str, *, special: bool = False) -> list[int]:
        return self._llm.tokenize(text.encode(), add_bos=False, special=special)

    def _frame(self) -> tuple[str, str]:
        """The text before the passage and between it and the question, in the model's own chat
        template when it has one (an instruction-tuned model answers in its own format)."""
        template = self._llm.metadata.get("tokenizer.chat_template")
        if not template:
            return INSTRUCTION, f"\n\n{ANSWER_CUE}"
        from llama_cpp.llama_chat_format import Jinja2ChatFormatter

        mark = "\x00PASSAGE\x00"
        formatter = Jinja2ChatFormatter(template=template, eos_token="", bos_token="")
        prompt = formatter(messages=[{"role": "user", "content": INSTRUCTION + mark}]).prompt
        before, after = prompt.split(mark, 1)
        return before, after + ANSWER_CUE
