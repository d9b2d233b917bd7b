"""The workload of bench/fleet.py: prompts as Sluice's own prompt builder lays them out.

Chat (three requests in four): users with profiles (name, language, expertise, a few lines
about themselves, their tags' hints) ask questions in conversations on one topic of a knowledge
base. Each question retrieves RAG_TOP_K passages of about RAG_CHUNK_TOKENS from its topic (a
follow-up retrieves a different set, as a different question does), rendered by
apps.rag.prompting.passages_block; the prompt is apps.chat.prompt.prompting.prompt_build's, from the
conversation's summary and turns. A quarter of the conversations are old ones the user comes
back to, long enough that the builder summarises them. When the builder says turns are due for
the summary, the background summary request (memory.summary_messages) joins the load and its
notes become the conversation's summary once it is answered, as background.py does.

API (one request in four): OpenAI-API clients of a few applications, each application's long
system prompt shared by all of its requests, one user message each, no conversation.

`layout` says where the passages go: "question" (beside the question, in the last user turn:
what submission.py does) or "system" (inside the system message, the layout before it).
Answer lengths: 70 % short answers (30-120 tokens), 30 % long (150-400), set by the simulated
engine's length marker at the end of the last message.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass, field

from django.conf import settings

from apps.chat.prompt.memory_summary import summary_messages
from apps.chat.prompt.prompting import prompt_build
from apps.chat.selectors import PromptProfile, PromptSources, Turn
from apps.rag.prompting import passages_block
from apps.rag.retrieval import Passage

SHORT, LONG, LONG_SHARE = (30, 120), (150, 400), 0.3
API_SHARE = 0.25
TOPICS, CHUNKS_PER_TOPIC, APPS, CLIENTS_PER_APP = 24, 24, 6, 4
WORDS = (
    "gate flow level basin queue reservoir turbine spillway valve pressure sensor schedule "
    "maintenance inspection capacity release channel sediment permit report season alarm "
    "operator budget contract warranty pump filter intake outlet barrier survey"
).split()
EXPERTISE = ("Beginner", "Intermediate", "Expert")
HINTS = (
    "Prefer short answers with a worked example.",
    "The user works in municipal water management; use its terms.",
    "Cite the regulation by number when there is one.",
    "The user is a student; explain the reasoning step by step.",
    "Give figures in metric units.",
    "The user maintains equipment on site; lead with the safety steps.",
)


def _text(rng: random.Random, chars: int) -> str:
    """About `chars` characters of words (about four a token, as the builder counts)."""
    text = " ".join(rng.choices(WORDS, k=max(1, round(chars / 7.7))))  # 7.7: a word and a space
    return text.capitalize() + "."


@dataclass
class Chat:
    id: int
    user: int
    topic: int
    turns_left: int
    history: list[Turn] = field(default_factory=list)  # newest first, as the builder reads it
    summary: str = ""
    summary_upto: int = 0
    next_id: int = 1
    busy: bool = False
    summarising: bool = False  # its summary request is in flight


@dataclass
class Ask:
    """One request: what the fleet runs, and what the workload needs back when it ends."""

    kind: str  # chat, api or background
    conversation: str  # "" for API requests
    user: str
    messages: list[dict[str, str]]
    tokens: int  # the answer's length
    chat: Chat | None = None
    due: list[Turn] = field(default_factory=list)  # turns its summary request folds in


class Workload:
    def __init__(self, *, rng: random.Random, active: int, users: int, layout: str) -> None:
        if layout not in ("question", "system"):
            raise ValueError(f"layout is question or system, not {layout!r}")
        self.rng = rng
        self.layout = layout
        self.profiles = [self._profile(u) for u in range(users)]
        chars = settings.RAG_CHUNK_TOKENS * 4
        self.chunks = [[_text(rng, chars) for _ in range(CHUNKS_PER_TOPIC)] for _ in range(TOPICS)]
        self.apps = [
            f"You are the assistant of application {a}. Follow its house rules.\n"
            + _text(rng, rng.randint(1_200, 6_000))
            for a in range(APPS)
        ]
        self.made = 0
        self.active = [self._open() for _ in range(active)]
        self.background: list[Ask] = []  # summary requests due, for the caller to send

    def _profile(self, user: int) -> PromptProfile:
        rng = self.rng
        about = _text(rng, rng.randint(40, 400)) if rng.random() < 0.7 else ""
        hints = rng.sample(HINTS, rng.randint(0, 3))
        language = "English" if rng.random() < 0.8 else rng.choice(("German", "Estonian"))
        return PromptProfile(
            display_name=f"User {user}",
            language=language,
            expertise=rng.choice(EXPERTISE),
            about=about,
            hints=hints,
        )

    def _open(self) -> Chat:
        rng = self.rng
        self.made += 1
        chat = Chat(
            id=self.made,
            user=rng.randrange(len(self.profiles)),
            topic=rng.randrange(TOPICS),
            turns_left=rng.randint(2, 10),
        )
        if rng.random() < 0.25:  # an old conversation the user comes back to
            for _ in range(rng.randint(6, 16)):
                self._turn(chat, "user", self._question(chat))
                self._turn(chat, "assistant", self._answer(rng.randint(*SHORT)))
        return chat

    def _turn(self, chat: Chat, role: str, text: str) -> Turn:
        turn = Turn(id=chat.next_id, role=role, text=text)
        chat.next_id += 1
        chat.history.insert(0, turn)
        return turn

    def _question(self, chat: Chat) -> str:
        rng = self.rng
        lead = rng.choice(
            (
                "How do I",
                "Why does the",
                "What is the",
                "Can you compare the",
                "Explain the",
                "Is it safe to",
            )
        )
        return f"{lead} {_text(rng, rng.randint(30, 300)).lower()}"

    def _answer(self, tokens: int) -> str:
        return _text(self.rng, tokens * 4)

    def _tokens(self) -> int:
        return self.rng.randint(*(LONG if self.rng.random() < LONG_SHARE else SHORT))

    def _passages(self, chat: Chat, question: str) -> str:
        picked = self.rng.sample(self.chunks[chat.topic], settings.RAG_TOP_K)
        return passages_block(
            Passage(
                number=n,
                chunk_id=chat.topic * 1000 + n,
                document_id=chat.topic,
                corpus_id=1,
                title=f"Topic {chat.topic} handbook",
                heading="",
                text=text,
                snippet=text[:80],
                source_url="",
                score=1.0,
                vector_score=1.0,
                text_score=1.0,
                metadata_score=0.0,
            )
            for n, text in enumerate(picked, start=1)
        )

    def next(self) -> Ask | None:
        """The next arrival: an API request, or the next question of a conversation that is
        not waiting for an answer (None: every conversation is: the arrival is dropped)."""
        rng = self.rng
        tokens = self._tokens()
        if rng.random() < API_SHARE:
            app = rng.randrange(APPS)
            question = f"{_text(rng, rng.randint(100, 1_200))} [[sim:tokens={tokens}]]"
            return Ask(
                "api",
                "",
                f"app{app}-{rng.randrange(CLIENTS_PER_APP)}",
                [
                    {"role": "system", "content": self.apps[app]},
                    {"role": "user", "content": question},
                ],
                tokens,
            )
        idle = [c for c in self.active if not c.busy]
        if not idle:
            return None
        chat = rng.choice(idle)
        question = f"{self._question(chat)} [[sim:tokens={tokens}]]"
        self._turn(chat, "user", question)
        block = self._passages(chat, question)
        sources = PromptSources(
            history=list(chat.history),
            profile=self.profiles[chat.user],
            summary=chat.summary,
            summary_upto=chat.summary_upto,
        )
        if self.layout == "question":
            prompt = prompt_build(conversation=None, passages=block, sources=sources)
        else:
            prompt = prompt_build(conversation=None, extra_system=block, sources=sources)
        chat.busy = True
        ask = Ask("chat", str(chat.id), str(chat.user), prompt.messages, tokens, chat)
        if prompt.to_summarise and not chat.summarising:  # sent after the question's request
            chat.summarising = True
            due = prompt.to_summarise
            messages = summary_messages(previous=chat.summary, turns=due)
            length = rng.randint(60, 120)
            messages[-1] = {
                **messages[-1],
                "content": f"{messages[-1]['content']} [[sim:tokens={length}]]",
            }
            self.background.append(
                Ask("background", str(chat.id), str(chat.user), messages, length, chat, due)
            )
        return ask

    def answered(self, ask: Ask) -> None:
        """The answer joins the history (or the notes become the summary); a conversation out
        of turns makes way for a new one."""
        chat = ask.chat
        if chat is None:
            return
        if ask.kind == "background":
            chat.summarising = False
            notes = _text(self.rng, min(1_600, len(chat.summary) + 80 * len(ask.due) + 200))
            chat.summary, chat.summary_upto = notes, ask.due[-1].id
            return
        self._turn(chat, "assistant", self._answer(ask.tokens))
        chat.busy = False
        chat.turns_left -= 1
        if chat.turns_left <= 0:
            self.active[self.active.index(chat)] = self._open()


def open_conversations(rate: float, think_s: float) -> int:
    """Conversations open at once for chat questions at `rate` x (1 - API_SHARE) per second to
    come about `think_s` apart in each; at least 40, so a low rate drops no question for want
    of an idle conversation."""
    return max(40, round(rate * (1 - API_SHARE) * think_s))


def encoded(messages: list[dict[str, str]]) -> str:
    return json.dumps(messages)
