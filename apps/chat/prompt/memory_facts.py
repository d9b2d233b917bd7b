"""What the user told Sluice about themselves, as entries with a subject and a value.

Each user turn is read sentence by sentence, questions too ("near my flat in Tartu?" says where
the user lives). A sentence yields:

- an entry about the user for each pattern it matches (where they live, their job, their pet's
  name, partner, allergies, name, and any "my <code, number, address...> is <value>"): the
  subject is the entry's key, so a later value replaces the earlier one, which is kept as
  `former` (the prompt says "formerly", never shows it as current);
- for a sentence about someone else ("My sister lives in Porto", "Yesterday my brother moved
  to Leuven"), an entry that says so about them ("The user's sister lives in Porto."), never
  one about the user;
- for another first-person statement that carries a number or a word facts come with, the
  sentence itself, quoted as what the user said.

Requests, small talk and questions without a fact in them yield nothing. Entries the user set
or deleted on the page (`edited`) win over what turns said before the edit.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, fields, replace
from functools import lru_cache

USER, OTHER, SAID = "user", "other", "said"


@dataclass
class Entry:
    key: str  # the subject: "city", "job", "pet:cat", "code:locker code", "other:…", "said:…"
    template: str  # the sentence, "{}" standing for the value
    value: str  # "" when the user deleted it (kept, so older turns do not bring it back)
    kind: str = USER  # USER: about the user; OTHER: about someone else; SAID: a quoted statement
    former: str = ""  # the value a later statement replaced
    at: int = 0  # the message that said it (for an edit: the newest message at the time)
    edited: bool = False  # set by the user on the page

    def text(self) -> str:
        if not self.value:
            return ""
        sentence = self.template.replace("{}", self.value, 1)
        # An edit's former value was wrong, not past: it is kept only so nothing repeats it.
        if self.former and not self.edited and self.former.lower() != self.value.lower():
            sentence = f"{sentence.rstrip('.')} (formerly {self.former})."
        return sentence

    @classmethod
    def from_dict(cls, data: dict) -> Entry | None:
        known = {f.name for f in fields(cls)}
        try:
            return cls(**{k: v for k, v in data.items() if k in known})
        except TypeError:
            return None


def entries_from_json(raw: Iterable) -> list[Entry]:
    return [e for d in raw or () if isinstance(d, dict) and (e := Entry.from_dict(d))]


def entries_to_json(entries: Iterable[Entry]) -> list[dict]:
    return [asdict(e) for e in entries]


# -- reading a turn -----------------------------------------------------------------------------

_SENTENCE = re.compile(r"[^.!?\n]+[.!?]*")
_LEAD = re.compile(
    r"^(?:(?:quick update|update|actually|anyway|also|so|oh|well|big news|by the way|btw|fyi|"
    r"hi|hello|hey|yes|no|ok|okay)\b[:,!-]?\s*)+",
    re.IGNORECASE,
)
NAME = r"(?-i:[A-Z][\w'-]+(?:\s+[A-Z][\w'-]+)?)"
_I_AM = r"i(?:'m|\s+am)"
RELATIONS = (
    r"sister|brother|mother|mum|mom|father|dad|parents|boss|manager|friend|neighbou?r|colleague|"
    r"co-?worker|son|daughter|kids|children|cousin|aunt|uncle|grandmother|grandma|grandfather|"
    r"grandpa|grandson|granddaughter|grandchildren|grandparents|niece|nephew|roommate|flatmate|"
    r"landlord|landlady|teacher|doctor|coach|in-laws"
)
PARTNERS = r"partner|wife|husband|girlfriend|boyfriend|fianc[ée]e?|spouse"
PETS = r"cat|dog|kitten|puppy|rabbit|hamster|parrot|budgie|horse|tortoise|turtle|ferret|goldfish"
# Whom a sentence may be about besides the user: a relative, a partner, a pet (plural too).
SOMEONE = rf"\b(?:{RELATIONS}|{PARTNERS}|{PETS})(?:s|es)?\b"
# ... said as theirs: "my sister", "our old neighbour", "the user's friend Noor", "Noor's dog".
_SOMEONE_ELSE = re.compile(
    rf"(?:\b(?:my|our|user's|users'|their|his|her)|'s)\s+(?:[\w-]+\s+)?{SOMEONE}", re.IGNORECASE
)


def about_someone_else(sentence: str) -> bool:
    """Whether a sentence speaks of someone in the user's life ("My sister lives in Porto",
    "The user's sister lives in Porto"), so that what it says may be theirs, not the user's.
    "The user is a teacher" names no one else."""
    return _SOMEONE_ELSE.search(sentence) is not None


# Jobs named without "I work as" ("a nurse like me", "As a pilot, ...") are taken only from
# this list: "As a beginner" or "a person like me" name no job.
OCCUPATIONS = frozenset(
    """accountant actor architect artist baker barber barista builder butcher carpenter cashier
    chef chemist cleaner coach consultant cook dentist designer developer doctor driver economist
    editor electrician engineer farmer firefighter gardener hairdresser journalist judge lawyer
    lecturer librarian mechanic midwife musician nurse optician painter paramedic pharmacist
    photographer physician physiotherapist pilot plumber police officer postman programmer
    psychologist radiographer receptionist researcher scientist secretary shopkeeper
    solicitor surgeon tailor teacher technician therapist translator tutor vet veterinarian
    waiter waitress welder writer""".split()
)
_STOP_TAIL = {
    *"now by for at in since and but so with these today here again".split(),
    *"who which that because".split(),
}


def _flags(pattern: str) -> re.Pattern[str]:
    return re.compile(pattern, re.IGNORECASE)


# (pattern, key): the pattern's `v` group is the value, `k` (if any) refines the key
# and the template ("{k}"). A pattern must itself say that the fact is the user's (I, my, we).
_USER_PATTERNS: list[tuple[re.Pattern[str], str]] = [
    (_flags(rf"\b(?:i|we)\s+(?:now\s+|still\s+)?live\s+in\s+(?P<v>{NAME})"), "city"),
    (
        _flags(
            rf"\b(?:i|we)(?:'ve|\s+have)?\s+(?:just\s+|recently\s+|finally\s+)?"
            rf"(?:moved|relocated)\s+(?:house\s+|back\s+)?to\s+(?P<v>{NAME})"
        ),
        "city",
    ),
    (_flags(rf"\bhome(?:\s+for\s+(?:me|us))?\s+is\s+(?:now\s+)?(?P<v>{NAME})"), "city"),
    (
        _flags(
            rf"\b(?:{_I_AM}|we(?:'re|\s+are))\s+(?:now\s+)?(?:living\s+|based\s+)?in\s+"
            rf"(?P<v>{NAME})(?=.*\b(?:now|moved|relocated|live|based|home)\b|\s+now\b)"
        ),
        "city",
    ),
    (
        _flags(
            rf"\b(?:my|our)\s+(?:flat|apartment|place|house|home)\s+(?:in|near)\s+(?P<v>{NAME})"
        ),
        "city",
    ),
    (_flags(rf"\b(?P<v>{NAME}),?\s+where\s+(?:i|we)\s+live\b"), "city"),
    (
        _flags(
            rf"\b(?:i|{_I_AM})\s+(?:now\s+)?(?:work|working)\s+as\s+(?:a|an)\s+(?P<v>[a-z][\w -]+)"
        ),
        "job",
    ),
    (_flags(rf"\b{_I_AM}\s+(?:a|an)\s+(?P<v>[a-z][\w-]+)\s+by\s+trade"), "job"),
    (
        _flags(r"\bi(?:'ve|\s+have)\s+been\s+(?:a|an)\s+(?P<v>[a-z][\w-]+)\s+for\b"),
        "job",
    ),
    (_flags(r"\b(?:a|an)\s+(?P<v>[a-z][\w-]+)\s+like\s+me\b"), "job?"),
    (_flags(r"^as\s+(?:a|an)\s+(?P<v>[a-z][\w-]+)\s*,"), "job?"),
    (_flags(rf"\b{_I_AM}\s+(?:a|an)\s+(?P<v>[a-z][\w-]+)\s*[.!,;]?$"), "job?"),
    (
        _flags(
            rf"\bmy\s+(?P<k>{PETS})(?:'s\s+name)?\s+(?:is\s+)?(?:called|named|is)\s+(?P<v>{NAME})"
        ),
        "pet",
    ),
    (
        _flags(
            rf"\bi\s+(?:have|own|got)\s+(?:a|an)\s+(?:[a-z-]+\s+)?(?P<k>{PETS})\s+"
            rf"(?:called|named)\s+(?P<v>{NAME})"
        ),
        "pet",
    ),
    (_flags(rf"\bmy\s+(?:[a-z-]+\s+)?(?P<k>{PETS}),?\s+(?P<v>{NAME})\b"), "pet"),
    (_flags(rf"\b(?P<v>{NAME}),\s+my\s+(?:[\w-]+\s+){{0,3}}?(?P<k>{PETS})\b"), "pet"),
    (
        _flags(
            rf"\bmy\s+(?P<k>{PARTNERS})(?:'s\s+name\s+is|\s+is\s+called|\s+is\s+named|,)?\s+"
            rf"(?P<v>{NAME})"
        ),
        "partner",
    ),
    (_flags(rf"\b{_I_AM}\s+married\s+to\s+(?P<v>{NAME})"), "partner"),
    (
        _flags(
            rf"\b{_I_AM}\s+(?:also\s+|very\s+|badly\s+|severely\s+)?allergic\s+to\s+"
            r"(?P<v>[a-z][a-z -]{1,30}?)(?=\s*(?:[.,;!?]|\band\s+i\b|$))"
        ),
        "allergy",
    ),
    (_flags(r"\b(?:my|a|an)\s+(?P<v>[a-z]+)\s+allergy\s+(?:like\s+mine)?"), "allergy?"),
    (_flags(rf"\bmy\s+name\s+is\s+(?P<v>{NAME})"), "name"),
    (_flags(rf"\bcall\s+me\s+(?P<v>{NAME})"), "name"),
    (_flags(rf"^{_I_AM}\s+(?P<v>{NAME})\s*[.!]?$"), "name"),
    (
        _flags(
            r"\b(?:my|our)\s+(?P<k>(?:[a-z]+\s+){0,3}?(?:code|number|pin|password|reference|"
            r"postcode|address|email|birthday|flight|seat|booking|plate|registration|budget|"
            r"deadline))\s+(?:is|are)\s+(?P<v>[^,;!?]+?)\s*(?=[,;!?]|\.(?:\s|$)|$)"
        ),
        "code",
    ),
]
_TEMPLATES = {
    "city": "The user lives in {}.",
    "job": "The user's job: {}.",
    "partner": "The user's {k} is {}.",
    "pet": "The user's {k} is called {}.",
    "allergy": "The user is allergic to {}.",
    "name": "The user's name is {}.",
    "code": "The user's {k} is {}.",
}
_OTHERS = _flags(rf"^(?:my|our)\s+(?P<rel>{RELATIONS})\b(?:'s)?")
_NAMED_RELATION = _flags(
    rf"^(?:my|our)\s+(?P<rel>{RELATIONS})(?:'s\s+name\s+is|\s+is\s+called|,)?\s+(?P<v>{NAME})\b"
)
_FIRST_PERSON = _flags(r"\b(?:i|i'm|i've|i'd|my|me|mine|we|our|us)\b")
_REQUEST = _flags(
    r"^(?:please\s+)?(?:tell|explain|show|give|write|list|help|describe|summari[sz]e|compare|"
    r"translate|make|find|suggest|recommend|draft|remind|can|could|would|will|what|why|how|"
    r"when|where|who|which|is|are|do|does|thanks|thank|let's|note to self)\b"
)
_STRONG = _flags(
    r"\b(?:remember|prefer|rather|favou?rite|allergic|birthday|born|live|moved|work|number|"
    r"code|reference|budget|deadline|vegetarian|vegan)\b|\d"
)
_MINE = _flags(r"\ballergy\s+like\s+mine|^my\s")
_MODIFIERS = {"new", "old", "current", "latest", "actual", "real", "own"}


def _tidy(value: str) -> str:
    """The value up to the first word that starts what is said about it ("nurse in a
    hospital" → "nurse"), at most six words."""
    words = []
    for word in value.strip(" .,;:!?'\"").split():
        if word.lower() in _STOP_TAIL:
            break
        words.append(word)
    return " ".join(words[:6])


def _key(text: str) -> str:
    return hashlib.sha1(" ".join(text.lower().split()).encode()).hexdigest()[:12]


def _third_person(sentence: str) -> str:
    """A sentence about someone in the user's life, told about the user ("My sister ..." →
    "The user's sister ...")."""
    text = re.sub(r"^(?:my|our)\b", "The user's", sentence.strip(), flags=re.IGNORECASE)
    text = re.sub(r"\b(?:my|our)\b", "the user's", text, flags=re.IGNORECASE)
    text = re.sub(r"\b(?:I|me|we|us)\b", "the user", text)
    return text if text[-1:] in ".!?" else text + "."


def _user_entries(sentence: str, question: bool, at: int) -> list[Entry]:
    found: dict[str, Entry] = {}
    for pattern, named_key in _USER_PATTERNS:
        # "job?": a value named without its usual phrase, kept only when it surely is one.
        key, sure = named_key.rstrip("?"), not named_key.endswith("?")
        for match in pattern.finditer(sentence):
            value = _tidy(match.group("v"))
            if not value:
                continue
            kind = (match.groupdict().get("k") or "").lower()
            if not sure and key == "job" and value.lower() not in OCCUPATIONS:
                continue
            if not sure and key == "allergy" and not _MINE.search(match.group()):
                continue
            if key == "code":
                if value.lower() in _STOP_TAIL or (question and not re.search(r"\d", value)):
                    continue
                label = [w for w in kind.split() if w not in _MODIFIERS] or kind.split()
                kind = " ".join(label)
            if key == "pet" and kind in ("kitten", "puppy"):
                kind = {"kitten": "cat", "puppy": "dog"}[kind]
            full = {
                "code": f"code:{' '.join(kind.split()[-2:])}",
                "pet": f"pet:{kind}",
                "allergy": f"allergy:{value.lower().rstrip('s')}",
            }.get(key, key)
            template = _TEMPLATES[key].replace("{k}", kind or "partner")
            found.setdefault(full, Entry(full, template, value, USER, at=at))
    return list(found.values())


def facts_of(text: str, *, at: int) -> list[Entry]:
    """The entries one user turn (message `at`) yields, in the order said."""
    entries: list[Entry] = []
    text = text.replace("\u2019", "'")  # one apostrophe for the patterns to know
    for match in _SENTENCE.finditer(text):
        raw = match.group().strip()
        sentence = _LEAD.sub("", raw).strip()
        if len(sentence.split()) < 2:
            continue
        question = raw.endswith("?")
        named = _NAMED_RELATION.match(sentence)
        rest = sentence[named.end() :] if named else sentence
        if named and len(rest.split()) < 2:  # "My sister's name is Ana."
            relation = named.group("rel").lower()
            template = f"The user's {relation} is called {{}}."
            entries.append(Entry(f"other:{relation}", template, named.group("v"), OTHER, at=at))
        if _OTHERS.match(sentence):
            if not question and len(rest.split()) >= 2:
                told = _third_person(sentence)
                entries.append(Entry(f"other:{_key(told)}", "{}", told, OTHER, at=at))
            continue
        mine = _user_entries(sentence, question, at)
        entries.extend(mine)
        if (
            not mine
            and not question
            and not _REQUEST.match(sentence)
            and _FIRST_PERSON.search(sentence)
            and _STRONG.search(sentence)
            and len(sentence.split()) >= 3
        ):
            if about_someone_else(sentence):  # "Yesterday my sister moved to Porto."
                told = _third_person(sentence)
                entries.append(Entry(f"other:{_key(told)}", "{}", told, OTHER, at=at))
                continue
            quoted = f'The user said: "{sentence.rstrip(".")}."'
            entries.append(Entry(f"said:{_key(sentence)}", "{}", quoted, SAID, at=at))
    return entries


@lru_cache(maxsize=4096)
def _facts_cached(text: str, at: int) -> tuple[Entry, ...]:
    """Every prompt of a long conversation reads its turns again: each is read once."""
    return tuple(facts_of(text, at=at))


# -- keeping them ---------------------------------------------------------------------------


def merge(
    entries: list[Entry], turns: Iterable, *, newer: Callable[[int, int], bool]
) -> list[Entry]:
    """`entries` (oldest first) updated by the user turns of `turns` (oldest first): a new
    value for a subject replaces the old one (kept as `former`) and moves the entry to the end.
    `newer(turn_id, message_id)`: whether the turn comes after that message; an entry the user
    edited is replaced only by turns after the edit."""
    by_key = {e.key: e for e in entries}
    order = [e.key for e in entries]
    for turn in turns:
        if turn.role != USER:
            continue
        for said in _facts_cached(turn.text, turn.id):
            entry = replace(said)  # the cached one stays as it was said
            current = by_key.get(entry.key)
            if current is not None and current.edited and not newer(turn.id, current.at):
                continue
            if current is not None:
                order.remove(entry.key)
                same = current.value.lower() == entry.value.lower()
                if current.kind == USER and current.value and not current.edited and not same:
                    entry.former = current.value
                elif same:
                    entry.former = current.former
            by_key[entry.key] = entry
            order.append(entry.key)
    return [by_key[key] for key in order]


def entry_edit(entries: list[Entry], *, key: str, value: str, at: int) -> Entry | None:
    """The user's own correction of entry `key` ("" deletes it), None for a key not among
    `entries`. It never says "formerly" (the old value was wrong, not past) and holds against
    every turn said before message `at`."""
    current = next((e for e in entries if e.key == key), None)
    if current is None:
        return None
    value = " ".join(value.split())[:200]
    if current.kind != USER and value:
        value = value if value[-1:] in ".!?" else value + "."
    # The replaced value is kept, so that no summary sentence repeats it (memory_summary.py).
    former = current.value if current.value.lower() != value.lower() else current.former
    return Entry(key, current.template, value, current.kind, former, at, True)


def values_of(entries: Iterable[Entry], kind: str) -> set[str]:
    """The names and numbers entries of `kind` hold (the values of OTHER and SAID entries are
    whole sentences: their capitalised words and numbers)."""
    found = set()
    for e in entries:
        if e.kind != kind or not e.value:
            continue
        if kind == USER:
            found.add(e.value.lower())
        else:
            found.update(w.lower() for w in re.findall(r"(?<=\s)[A-Z][\w'-]+|\d{2,}", e.value))
    return found
