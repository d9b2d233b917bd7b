"""bench/memory_grade.py: a value is found in a prompt whatever characters it starts or ends
with, and never inside a longer word or number; a current value the prompt shows only as
earlier is counted."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))

import memory_grade
from memory_data import Fact


def test_a_value_that_starts_or_ends_with_a_sign_is_found():
    assert memory_grade.has("£850", "ok birthday money came in, now got £850.")
    assert memory_grade.has("68%", "i dropped it to 68% like u said")
    assert memory_grade.has("$2,200", "so the budget's $2,200 now")
    assert memory_grade.has("Kotlin", "six years of kotlin now")


def test_a_value_inside_a_longer_word_or_number_is_not():
    assert not memory_grade.has("£85", "now got £850.")
    assert not memory_grade.has("68%", "it went to 168% of the plan")
    assert not memory_grade.has("Pip", "a pipe cleaner")


def test_an_old_value_with_a_sign_shown_as_current_is_counted():
    fact = Fact(subject="budget", placement="corrected", value="£850", old="£700")
    assert memory_grade.presents_old(fact, '- "my budget is £700 for the build."')
    assert not memory_grade.presents_old(fact, '- Earlier: "my budget is £700 for the build."')


def test_the_corrections_own_words_naming_the_old_value_are_not_it_shown_as_current():
    turn = "Change of plan. Valencia had no more places! So I will run Seville in February."
    fact = Fact("race", "corrected", "Seville", "Valencia", corrected_in=turn)
    assert not memory_grade.presents_old(fact, '- "Valencia had no more places!"')
    # The same words from any other turn, or retold, still count.
    assert memory_grade.presents_old(fact, '- "I run Valencia in December."')
    assert memory_grade.presents_old(fact, "- The user has no more places in Valencia.")
    elsewhere = Fact("race", "corrected", "Seville", "Valencia", corrected_in="So, Seville.")
    assert memory_grade.presents_old(elsewhere, '- "Valencia had no more places!"')


def test_a_current_value_shown_only_in_lines_marked_earlier_is_counted():
    fact = Fact(subject="dog", placement="user", value="Bramble")
    hedged = '- Earlier: "I had to let Bramble in."\n- "I love the blackbirds."'
    assert memory_grade.only_as_earlier(fact, hedged, recent="")
    # Shown as current in another line, or said in the recent turns: not hedged.
    assert not memory_grade.only_as_earlier(fact, hedged + '\n- "Bramble is a spaniel."', "")
    assert not memory_grade.only_as_earlier(fact, hedged, recent="user: Bramble ate it.")
    # Not in the prompt at all: lost, which the grade counts elsewhere.
    assert not memory_grade.only_as_earlier(fact, '- "I love the blackbirds."', recent="")


def test_a_quote_of_the_user_holding_quotation_marks_of_their_own_shows_no_other_as_theirs():
    from memory_data import Conversation, Turn

    said = 'Ingrid suggested "Olav".'
    conversation = Conversation(
        turns=[Turn(1, "user", said)], facts=[], question="", known_at={}, others={"Olav"}
    )
    assert not memory_grade.others_as_user(conversation, [f'- Earlier: "{said}"'])
    # Outside a quote of the user's words, it is shown as theirs.
    shown = memory_grade.others_as_user(conversation, ["- The user's choice: Olav."])
    assert [line for line, _ in shown] == ["- The user's choice: Olav."]
    # The assistant's words quoted beside the user's say whose they are too.
    took = '- You suggested: "Ask Olav for the van"; the user replied: "Ingrid suggested "Olav"."'
    assert not memory_grade.others_as_user(conversation, [took])
