"""Log probabilities and logit_bias on llama.cpp, both from one logits processor.

llama-cpp-python computes logprobs itself only for a model loaded with `logits_all=True`, which
keeps the logits of every prompt token (the context's length times the vocabulary's, per slot)
and slows every answer, asked or not; and it drops a request's own logits processors when
`logit_bias` is given too. A logits processor sees each step's logits before sampling however
the model was loaded: it keeps the step's log-softmax (the model's own distribution, before the
bias, the penalties and any grammar), and the token sampled from it is the newest input token
when the next step begins. So an output's tokens are known one step late, and each output is
held back until the next arrives; the last token, which no step follows when the answer is cut
at its token cap, is found from the text it wrote.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from contract.capabilities import EngineRefused
from worker.engines.base import EngineOutput, EngineRequest

# How many of the likeliest tokens are searched for the one that wrote an answer's last piece.
LAST_TOKEN_SEARCH = 1024


def bias_of(request: EngineRequest, vocabulary: int) -> dict[int, float]:
    """The request's logit_bias by token id; EngineRefused for an id the model does not have
    (the web cannot know a model's vocabulary)."""
    bias = {int(token): float(value) for token, value in request.logit_bias.items()}
    beyond = [token for token in bias if not 0 <= token < vocabulary]
    if beyond:
        raise EngineRefused(
            f"logit_bias names token id {beyond[0]}, but this model's vocabulary has "
            f"{vocabulary} tokens (ids 0 to {vocabulary - 1})"
        )
    return bias


class TokenScores:
    """The logits processor of one generation (llama-cpp-python calls it with the input ids
    and the step's logits, indexed by token id), and the outputs it holds back to give them
    their tokens' log probabilities."""

    def __init__(self, model: Any, *, top: int | None, bias: dict[int, float]) -> None:
        self.model = model
        self.top = top  # None: no logprobs asked for
        self.bias_ids = np.array(list(bias), dtype=np.intc)
        self.bias_values = np.array(list(bias.values()), dtype=np.single)
        self.answer_start: int | None = None  # where the answer begins among the input ids
        self.pending: np.ndarray | None = None  # the latest step's log-softmax
        self.entries: list[dict] = []  # tokens known, not yet handed on
        self.held: EngineOutput | None = None
        self.text = bytearray()  # what the answer wrote, and how much of it the tokens cover
        self.covered = 0

    def __call__(self, input_ids: np.ndarray, scores: np.ndarray) -> np.ndarray:
        if self.top is not None:
            self._step(input_ids, scores)
        if len(self.bias_ids):
            scores[self.bias_ids] += self.bias_values
        return scores

    def _step(self, input_ids: np.ndarray, scores: np.ndarray) -> None:
        if self.answer_start is None:
            self.answer_start = len(input_ids)
        elif self.pending is not None:  # the token the last step sampled is now an input
            self._known(int(input_ids[-1]))
        logits = scores.astype(np.float64)
        peak = logits.max()
        self.pending = logits - peak - np.log(np.exp(logits - peak).sum())

    def _known(self, token: int) -> None:
        assert self.pending is not None
        piece = self._piece(token)
        self.covered += len(piece)
        self.entries.append({**self._alternative(token, piece), "top_logprobs": self._top()})
        self.pending = None

    def _top(self) -> list[dict]:
        if not self.top:
            return []
        scores = self.pending
        likeliest = np.argpartition(scores, -self.top)[-self.top :]
        likeliest = likeliest[np.argsort(scores[likeliest])[::-1]]
        return [self._alternative(int(token), self._piece(int(token))) for token in likeliest]

    def _alternative(self, token: int, piece: bytes) -> dict:
        return {
            "token": piece.decode("utf-8", errors="replace"),
            "logprob": float(self.pending[token]),
            "bytes": list(piece),
        }

    def _piece(self, token: int) -> bytes:
        return self.model.detokenize([token])

    def outputs(self, output: EngineOutput) -> list[EngineOutput]:
        """The outputs to hand on now that `output` has come, each with the log probabilities
        of its tokens (when asked for): the one held before it, and this one if it ends the
        answer."""
        if self.top is None:
            return [output]
        self.text += output.text.encode()
        ready = []
        if self.held is not None:
            self.held.logprobs = self._take()
            ready.append(self.held)
        self.held = output
        if output.finish_reason is not None:
            self._last()
            if ready and not output.text:  # the last token's text came in the output before
                ready[-1].logprobs += self._take()
            output.logprobs = self._take()
            ready.append(output)
            self.held = None
        return ready

    def _take(self) -> list[dict]:
        entries, self.entries = self.entries, []
        return entries

    def _last(self) -> None:
        """The answer's last token when no step followed it: the likeliest whose piece is the
        text the known tokens do not cover (nothing when they cover it all: the answer ended
        on an end-of-text token, whose step is the one pending)."""
        rest = bytes(self.text[self.covered :])
        if self.pending is None or not rest:
            return
        search = min(LAST_TOKEN_SEARCH, len(self.pending))
        likeliest = np.argpartition(self.pending, -search)[-search:]
        for token in likeliest[np.argsort(self.pending[likeliest])[::-1]]:
            if self._piece(int(token)) == rest:
                self._known(int(token))
                return
