"""The facts bench/memory.py plants: per subject, its values and how a user (or the assistant)
says it in each placement."""

from __future__ import annotations

import random

PLACEMENTS = ("user", "question", "assistant", "corrected", "implied")

CITIES = {  # value → how a user describes it without naming it
    "Tallinn": "the capital of Estonia",
    "Tartu": "Estonia's old university town",
    "Porto": "the Portuguese city famous for port wine",
    "Hobart": "the capital of Tasmania",
    "Gdansk": "the Polish port where Solidarity began",
    "Nagoya": "the Japanese city where Toyota is based",
    "Ljubljana": "the capital of Slovenia",
    "Mombasa": "Kenya's big port on the Indian Ocean",
    "Leuven": "the Belgian university town near Brussels",
    "Tucson": "the Arizona city next to the Saguaro park",
}
JOBS = {
    "radiographer": "take X-ray images of patients in a hospital",
    "pharmacist": "hand out prescription medicines behind a chemist's counter",
    "electrician": "wire new houses and repair fuse boxes",
    "librarian": "run the lending desk and catalogue at the public library",
    "architect": "design buildings and draw up their plans",
    "paramedic": "ride the ambulance and treat people at the scene",
    "translator": "turn contracts from German into English",
    "accountant": "do other companies' books and tax returns",
}
PETS = ["Miso", "Biscuit", "Pixel", "Juniper", "Mochi", "Pepper", "Waffles", "Nimbus", "Tofu"]
PARTNERS = [
    "Priya",
    "Tomasz",
    "Aiyana",
    "Kenji",
    "Marisol",
    "Henrike",
    "Dmitri",
    "Farah",
    "Lachlan",
    "Ingrid",
    "Mateo",
    "Noor",
]
ALLERGIES = {
    "sesame": "the little seeds on burger buns",
    "shellfish": "prawns, crab and lobster",
    "peanut": "the legume in satay sauce",
    "kiwi": "the fuzzy green fruit",
    "penicillin": "the antibiotic from mould",
}


def _plural(allergen: str) -> str:
    return "peanuts" if allergen == "peanut" else allergen


def with_article(word: str) -> str:
    return f"an {word}" if word[0] in "aeiou" else f"a {word}"


def random_code(rng: random.Random) -> str:
    return str(rng.randint(1000, 9999))


# Per subject: the value pool, the placements it supports, and the phrasings. Each phrasing
# returns the turns it needs: (user text, assistant text or None) pairs.
def _city(rng, placement, value, old):
    if placement == "user":
        return [
            (
                rng.choice(
                    [
                        f"I live in {value}.",
                        f"We moved to {value} last year.",
                        f"Home for me is {value} these days.",
                    ]
                ),
                None,
            )
        ]
    if placement == "question":
        return [
            (
                rng.choice(
                    [
                        f"Is it usually cold in winter near my flat in {value}?",
                        f"Are there good running routes close to my place in {value}?",
                        f"What's a nice day trip from {value}, where we live?",
                    ]
                ),
                None,
            )
        ]
    if placement == "assistant":
        return [
            (
                f"I live in {CITIES[value]}, but I always blank on its name. What is it called?",
                f"You mean {value}. It has a well-kept old town and mild, short summers.",
            ),
            ("Yes, that's the one, thanks. Silly of me to forget.", None),
        ]
    if placement == "corrected":
        return [(f"I live in {old}.", None)], [
            (
                rng.choice(
                    [
                        f"Quick update: we moved house last month, we're in {value} now.",
                        f"Actually we've relocated: home is {value} since the spring.",
                    ]
                ),
                None,
            )
        ]
    return [
        (
            rng.choice(
                [
                    f"The ferry back to {value} was late again, so I got home after midnight.",
                    f"Our landlord in {value} is putting the rent up again.",
                ]
            ),
            None,
        )
    ]


def _job(rng, placement, value, old):
    if placement == "user":
        return [
            (
                rng.choice(
                    [
                        f"I work as {with_article(value)}.",
                        f"I'm {with_article(value)} by trade.",
                        f"I've been {with_article(value)} for nine years.",
                    ]
                ),
                None,
            )
        ]
    if placement == "question":
        return [
            (
                rng.choice(
                    [
                        f"What stretches help {with_article(value)} like me who stands all day?",
                        f"As {with_article(value)}, should I take one long holiday or two "
                        "short ones?",
                    ]
                ),
                None,
            )
        ]
    if placement == "assistant":
        return [
            (
                f"What's the proper word for my job? I {JOBS[value]}.",
                f"That job is called {with_article(value)}. It's a skilled, regulated profession.",
            ),
            ("Right, that's what I do. I'll use that word on my CV.", None),
        ]
    if placement == "corrected":
        return [(f"I work as {with_article(old)}.", None)], [
            (f"Big news: I changed careers, I'm working as {with_article(value)} now.", None)
        ]
    return [(f"Another long shift today; that's {value} life for you.", None)]


def _pet(rng, placement, value, old):
    if placement == "user":
        return [(rng.choice([f"My cat is called {value}.", f"I have a cat named {value}."]), None)]
    if placement == "question":
        return [
            (
                rng.choice(
                    [
                        f"Is it normal that my cat {value} sleeps eighteen hours a day?",
                        f"What should I feed {value}, my ten-year-old cat?",
                    ]
                ),
                None,
            )
        ]
    if placement == "assistant":
        return [
            (
                "Can you suggest a short, cute name for my new kitten?",
                f"How about {value}? It's short, friendly and easy to call out.",
            ),
            ("Love it, that's her name from now on.", None),
        ]
    return [(f"{value} knocked my coffee off the table again this morning, typical cat.", None)]


def _partner(rng, placement, value, old):
    if placement == "user":
        return [(rng.choice([f"My partner's name is {value}.", f"I'm married to {value}."]), None)]
    if placement == "question":
        return [(f"What's a good anniversary gift for my partner {value}, who loves hiking?", None)]
    return [(f"{value} and I are celebrating ten years together on Saturday.", None)]


def _allergy(rng, placement, value, old):
    if placement == "user":
        return [(f"I'm allergic to {_plural(value)}.", None)]
    if placement == "question":
        return [
            (f"Which takeaway dishes are safe with {with_article(value)} allergy like mine?", None)
        ]
    if placement == "assistant":
        return [
            (
                f"What's the name of {ALLERGIES[value]}? I react badly to it.",
                f"That's {_plural(value)}. It's one of the common allergens on food labels.",
            ),
            ("Yes, that. I get hives from it, so I avoid it.", None),
        ]
    return [
        (
            f"I had to send the curry back because it had {_plural(value)} in it, and I can't "
            "risk another trip to A&E.",
            None,
        )
    ]


def _locker(rng, placement, value, old):
    if placement == "user":
        return [(f"My gym locker code is {value}.", None)]
    if placement == "question":
        return [(f"If my gym locker code is {value}, is that too easy to guess?", None)]
    if placement == "assistant":
        return [
            (
                "Can you pick a random four-digit code for my gym locker?",
                f"How about {value}? It has no repeated digits and isn't a year.",
            ),
            ("Great, I've set the locker to that.", None),
        ]
    if placement == "corrected":
        return [(f"My gym locker code is {old}.", None)], [
            (f"The gym reset all the lockers, so my new locker code is {value}.", None)
        ]
    return [(f"Note to self: {value} opens the blue locker at the gym.", None)]


# subject → (phrasing, values or a value maker, placements, asked, question)
SUBJECTS = {
    "city": (
        _city,
        list(CITIES),
        PLACEMENTS,
        "which city I live in now",
        "Which city do I live in now?",
    ),
    "job": (_job, list(JOBS), PLACEMENTS, "what my job is now", "What is my job now?"),
    "pet": (
        _pet,
        PETS,
        ("user", "question", "assistant", "implied"),
        "what my cat is called",
        "What is my cat called?",
    ),
    "partner": (
        _partner,
        PARTNERS,
        ("user", "question", "implied"),
        "what my partner's name is",
        "What is my partner's name?",
    ),
    "allergy": (
        _allergy,
        list(ALLERGIES),
        ("user", "question", "assistant", "implied"),
        "what I'm allergic to",
        "What am I allergic to?",
    ),
    "locker": (
        _locker,
        None,
        PLACEMENTS,
        "what my gym locker code is now",
        "What is my gym locker code now?",
    ),
}
