"""Memory that tells the truth: what the user said, kept in their own words (statements and
questions that speak of them, never requests to the assistant), what they said of someone else
quoted as said, a reply that took a suggestion kept with it, an older statement on the same
subject shown as earlier (never as current), summary sentences that repeat no out-of-date value
and no instruction, a budget with a rule for what leaves first, and the page's note: the
prompt's memory block, whose entries the user corrects or deletes. Also what the conversation's
order decides: an edit keeps a summary whose last turn survives it, and an export counts covered
turns in order."""

from __future__ import annotations

import pytest

from apps.chat import background, turns
from apps.chat.data.export import conversation_export_data, conversation_import
from apps.chat.models import ConversationSummary, Message
from apps.chat.prompt import (
    memory,
    memory_facts,
    memory_reading,
    memory_summary,
    memory_summary_lines,
)
from apps.chat.prompt.memory_proposals import proposal_of
from apps.chat.prompt.prompting import prompt_build
from apps.chat.selectors import PromptSources, Turn, prompt_sources
from apps.chat.services import conversation_create, message_create
from core.redis_client import get_redis, keys
from tests.chat.test_memory import (
    chat_with_an_answer_stored_after_the_next_question,
    record_answer,
)

pytestmark = pytest.mark.django_db

FILLER = "Tell me about river number {n} and how its banks are shaped."
ANSWER = "River {n} runs past farms and mills; its banks are " + "mud " * 20


@pytest.fixture
def small_window(settings):
    settings.MODEL_CONTEXT_TOKENS, settings.MODEL_MAX_TOKENS = 900, 100


def chat(user, said: list[str], *, fillers: int = 24):
    """The user's lines first, each answered, then `fillers` exchanges that push them out of
    the window, then a closing question."""
    conversation = conversation_create(owner=user)
    for n, text in enumerate([*said, *(FILLER.format(n=n) for n in range(fillers))]):
        message_create(conversation=conversation, role="user", text=text)
        message_create(
            conversation=conversation, role="assistant", request_id=f"a{n}", text=ANSWER.format(n=n)
        )
    message_create(conversation=conversation, role="user", text="What do you know about me?")
    return conversation


def system_of(conversation) -> str:
    return prompt_build(conversation=conversation).messages[0]["content"]


def said(text: str) -> list[str]:
    return [e.value for e, _ in memory_facts.statements_of(text, at=1)]


def merged(*turns_said: tuple[str, str]) -> list[memory_facts.Entry]:
    history = [Turn(n + 1, role, text) for n, (role, text) in enumerate(turns_said)]
    return memory_facts.merge([], history, newer=lambda a, b: a > b)


def taken(options: str, reply: str) -> memory_facts.Entry:
    """The one entry of a reply that took the assistant's `options`."""
    [took] = [e for e in merged(("assistant", options), ("user", reply)) if e.kind == "took"]
    return took


def test_statements_and_questions_that_speak_of_the_user_are_kept_word_for_word():
    assert said("Is it usually cold in winter near my flat in Tartu?") == [
        "Is it usually cold in winter near my flat in Tartu?"
    ]
    assert said("fwiw im a night-shift paramedic. how do tides work?") == [
        "fwiw im a night-shift paramedic."
    ]
    # A detail in passing counts without "I": the ferry says where the user lives, the cat
    # what the user keeps; "me" other than in a request speaks of the user.
    assert said("The ferry back to Tartu was late again.") == [
        "The ferry back to Tartu was late again."
    ]
    assert said("Is it normal for a Norwegian Forest cat to shed this much?") == [
        "Is it normal for a Norwegian Forest cat to shed this much?"
    ]
    assert said("the club moved me to the thursday squad.") == [
        "the club moved me to the thursday squad."
    ]
    # Asked of a generic person, a question speaks of the user at one remove.
    for generic in (
        "is there a bread someone with celiac can eat with it?",
        "Is it safe to use bleach on the grout when you've got a septic tank?",
    ):
        assert said(generic) == [generic]
    # Whatever else the user asserts tells of their life, capitals or not; and a question in
    # the first person is kept, weighing less than a statement.
    assert said("marmaduke just knocked the saffron jar off the shelf.") == [
        "marmaduke just knocked the saffron jar off the shelf."
    ]
    assert said("How do I puppy-proof a third-floor apartment with a balcony?") == [
        "How do I puppy-proof a third-floor apartment with a balcony?"
    ]
    asked, stated = (
        memory_facts.statements_of(text, at=1)[0][1]
        for text in ("how do i undo a push to a feature branch?", "I'm an electrician by trade.")
    )
    assert stated > asked > 0
    for nothing in (
        "How do tides work?",
        "What do you think of that?",
        "Tell me about river number 16 and how its banks are shaped.",
        "Can you explain the 1929 crash to me?",
        "please give me three names for 2 kittens.",
        "ok",
    ):
        assert said(nothing) == [], nothing


def test_what_the_user_said_of_someone_else_stays_in_their_words():
    entries = merged(("user", "My sister lives in Porto and works as a librarian. I'm a nurse."))
    assert [e.text() for e in entries] == [
        '"My sister lives in Porto and works as a librarian."',
        '"I\'m a nurse."',
    ]
    # A summary may not retell the sister's detail as the user's; the user's own may stay.
    summary = "The user lives in Porto.\nThe user asked about night shifts in Porto hospitals."
    assert memory_summary_lines.summary_lines(summary, entries) == []
    entries += merged(("user", "We live in Porto too."))
    assert memory_summary_lines.summary_lines(summary, entries) == summary.split("\n")


def test_a_summary_may_not_retell_what_the_user_said_of_another_as_the_users_own():
    entries = merged(
        ("user", "My neighbour is allergic to sesame, so I never bring tahini to her place."),
        ("user", "My boss's cat sleeps on the printer all day."),
    )
    summary = "\n".join(
        [
            "The user is allergic to sesame.",  # the neighbour's, told as the user's
            "The user's cat sleeps on the printer.",  # the boss's
            "The user's neighbour is allergic to sesame.",  # whose it is, named
            "The user never brings tahini to the neighbour's place.",  # the user's own clause
            "The user's boss has a cat that sleeps on the printer.",
        ]
    )
    assert memory_summary_lines.summary_lines(summary, entries) == summary.split("\n")[2:]
    # Once the user says it of themselves too, it is theirs as well.
    entries += merged(("user", "Funny thing is I'm allergic to sesame too."))
    assert (
        memory_summary_lines.summary_lines(summary, entries)[0] == "The user is allergic to sesame."
    )


def test_a_reply_that_takes_the_assistants_suggestion_is_kept_with_it():
    entries = merged(
        ("user", "We got a kitten! Help me name her, something short."),
        ("assistant", "Congratulations! How about **Maple**? Or Juniper, if you like trees."),
        ("user", "Perfect, going with that one."),
    )
    took = [e for e in entries if e.kind == memory_facts.TOOK]
    assert len(took) == 1
    assert "Maple" in took[0].text() and took[0].text().endswith(
        'the user replied: "Perfect, going with that one."'
    )
    # A statement of the user's own after an answer is a statement, not a reply.
    entries = merged(
        ("user", "Any tips for night shifts?"),
        ("assistant", "Keep the room dark. See the NHS guide, or ask Dr Patel on your ward."),
        ("user", "I work as a radiographer."),
    )
    assert [(e.kind, e.value) for e in entries] == [("said", "I work as a radiographer.")]


def test_an_option_taken_from_a_list_by_its_place_or_its_name_is_kept_with_the_list():
    names = (
        "Some ideas: 1) NekoNet, for cat lovers. 2) Tanuki_5G, a raccoon dog, good for a 5 GHz "
        "band. 3) Onigiri LAN, simple and tasty. 4) Hotspot Totoro, friendly."
    )
    for reply in ("Number two is funny. I set it now.", "ok onigiri lan it is, set it now"):
        took = [e for e in merged(("assistant", names), ("user", reply)) if e.kind == "took"]
        assert len(took) == 1, reply
        assert took[0].context == "1. NekoNet; 2. Tanuki_5G; 3. Onigiri LAN; 4. Hotspot Totoro"
    # Thanks for an answer that named things takes none of them.
    answer = "Madeira in March is mild, usually around 18 to 20 degrees, but showery in the hills."
    assert [e.kind for e in merged(("assistant", answer), ("user", "Thank you dear."))] == []


def test_an_assistant_turn_is_read_once_however_many_prompts_read_it():
    """Every prompt reads the conversation's turns again: a turn's proposal is read the first
    time only, and what later prompts keep of a reply to it is the same."""

    names = "Some ideas: 1) Kittiwake, a seabird. 2) Puffin, a clown. 3) Gannet, a diver."
    proposal_of.cache_clear()
    kept = [merged(("assistant", names), ("user", "ok the second one it is"))]
    first = proposal_of.cache_info()
    kept += [merged(("assistant", names), ("user", "ok the second one it is")) for _ in range(2)]
    assert first.misses > 0
    assert proposal_of.cache_info().misses == first.misses
    assert proposal_of.cache_info().hits > first.hits
    assert kept[0] == kept[1] == kept[2]
    took = [e.context for e in kept[0] if e.kind == "took"]
    assert took == ["1. Kittiwake; 2. Puffin; 3. Gannet"]


def test_a_number_is_no_place_in_a_list_and_needs_a_list_to_be_one():
    options = "Some ideas: 1. Raspberry Pi 5; 2. Intel NUC 11; 3. Beelink EQ12."
    question = "Sensible. What is the plan for storage?"
    count = ("user", "two 4TB drives in a usb enclosure.")
    # A count beside a value of its own, a list still in view: a statement, not the second
    # option.
    entries = merged(("assistant", options), ("user", "hm."), ("assistant", question), count)
    assert [(e.kind, e.value) for e in entries if e.at == 4] == [("said", count[1])]
    # A place without any list before it: a number, not a choice.
    entries = merged(
        ("assistant", question), ("user", "update: my brother gave me his, so three now.")
    )
    assert [e.kind for e in entries] == ["said"]
    took = [e for e in merged(("assistant", options), ("user", "the second.")) if e.kind == "took"]
    assert took and took[0].context.startswith("1. Raspberry Pi 5; 2. Intel NUC 11")


def test_a_reply_takes_a_proposal_made_before_the_turns_a_summary_folds():
    """A summary folds a conversation in parts: a reply at the start of a part still takes the
    list the assistant gave at the end of the part before it."""
    history = [
        Turn(1, "user", "Help me pick a name for my sourdough starter."),
        Turn(2, "assistant", "Some ideas:\n1. Clint Yeastwood\n2. Bread Pitt\n3. Doughpac"),
        Turn(3, "user", "the second one, obviously"),
    ]
    folded = memory_facts.merge([], history[:2], newer=lambda a, b: a > b)
    alone = memory_facts.merge(folded, history[2:], newer=lambda a, b: a > b)
    assert not [e for e in alone if e.kind == memory_facts.TOOK]  # the list is not among them
    entries = memory_facts.merge(folded, history[2:], newer=lambda a, b: a > b, before=history[:2])
    took = [e for e in entries if e.kind == memory_facts.TOOK]
    assert [(e.value, e.context) for e in took] == [
        ("the second one, obviously", "1. Clint Yeastwood; 2. Bread Pitt; 3. Doughpac")
    ]


def test_a_later_statement_on_the_same_subject_shows_the_older_as_earlier():
    entries = merged(
        ("user", "I live in Tallinn."),
        ("user", "My cat is called Miso."),
        ("user", "Quick update: we moved house last month, we're in Tartu now."),
    )
    texts = [e.text() for e in entries]
    assert texts == [
        'Earlier: "I live in Tallinn."',
        '"My cat is called Miso."',
        '"Quick update: we moved house last month, we\'re in Tartu now."',
    ]
    # A summary written before the move may not say Tallinn any more.
    summary = "The user lives in Tallinn.\nThe user asked about moving house."
    assert memory_summary_lines.summary_lines(summary, entries) == [
        "The user asked about moving house."
    ]


def test_a_summary_sentence_that_only_repeats_a_replaced_statement_is_dropped():
    # Written in lower case, the old language is no name: only the words say it is out of date.
    entries = merged(
        ("user", "pea it is. also learning japanese, 3 months in."),
        ("user", "My cat is called Miso."),
        ("user", "update. dropped it, switched to korean. hangul way easier"),
    )
    [japanese] = [e for e in entries if "japanese" in e.value]
    assert japanese.text().startswith("Earlier")
    summary = "also learning japanese.\nThe user is learning korean now.\nThe user has a cat."
    assert memory_summary_lines.summary_lines(summary, entries) == [
        "The user is learning korean now.",
        "The user has a cat.",
    ]


def test_a_question_that_says_something_new_on_the_way_shows_the_older_as_earlier():
    texts = [
        e.text()
        for e in merged(
            ("user", "I've saved about £300 for a new bike."),
            ("user", "Good news, I got a bonus so I now have £550 to spend, should I go electric?"),
        )
    ]
    assert texts == [
        'Earlier: "I\'ve saved about £300 for a new bike."',
        '"Good news, I got a bonus so I now have £550 to spend, should I go electric?"',
    ]


@pytest.mark.parametrize(
    "question",
    [
        "Is a Brompton good for a short commute?",  # asks only
        "If I sell the car, should I get a monthly train pass?",  # a condition, not a fact
    ],
)
def test_a_question_that_asserts_nothing_replaces_nothing(question):
    entries = merged(("user", "I drive a 2015 Golf to the office every day."), ("user", question))
    assert [e.later for e in entries] == ["", ""]


def test_an_older_line_that_names_the_replaced_value_is_shown_as_earlier_too():
    entries = merged(
        ("user", "Leave is fixed by roster, I got 9 days for Japan."),
        ("user", "Can you plan the trip?"),
        ("assistant", "With 9 days you can do one region properly: Hokkaido in winter."),
        ("user", "Hokkaido sounds nice."),
        ("user", "My brother Kenji lives in Osaka."),
        ("user", "Actually it's 12 days now, my supervisor approved extra leave today!"),
    )
    shown = {e.value: e.text() for e in entries}
    assert shown["Leave is fixed by roster, I got 9 days for Japan."].startswith("Earlier")
    # The choice names the old value only in the suggestion it answers: earlier as a whole.
    assert shown["Hokkaido sounds nice."].startswith('Earlier: You suggested: "With 9 days')
    assert shown["My brother Kenji lives in Osaka."] == '"My brother Kenji lives in Osaka."'
    assert not shown[
        "Actually it's 12 days now, my supervisor approved extra leave today!"
    ].startswith("Earlier")


def test_a_correction_is_matched_by_the_clause_it_corrects_not_the_whole_sentence():
    entries = merged(
        ("user", "Work is busy, and I'm starting a pottery class on Tuesday evenings in January."),
        ("user", "My daughter Ada plays the violin."),
        ("user", "Pottery update: the centre moved me into the Thursday evening class instead."),
    )
    assert [bool(e.later) for e in entries] == [True, False, False]


def test_each_clause_of_a_newer_statement_replaces_what_it_speaks_of():
    # The first clause speaks of Tomasz, whom an older line names; the last corrects the hives.
    entries = merged(
        ("user", "I keep two hives of bees at the bottom of the garden."),
        ("user", "Tomasz is my neighbour, by the way."),
        ("user", "Tomasz came on Sunday and helped me split a colony, so I have three hives now."),
    )
    assert entries[0].text().startswith("Earlier")
    assert not entries[2].later


@pytest.mark.parametrize(
    "first, correction",
    [
        (
            "I swim 20 lengths every morning before work.",
            "Pushed it up this month, it's thirty lengths a day now.",
        ),
        ("The quiz team is 4 of us on Tuesdays.", "Two more joined last week so we're six now."),
        (
            "The fencing man quoted twenty-two hundred for the whole garden.",
            "He came back after measuring, the real price is thirty-five hundred.",
        ),
    ],
)
def test_a_number_corrected_in_words_replaces_the_older_one(first, correction):
    entries = merged(
        ("user", first),
        ("user", "My friend Oskar runs marathons in Oslo."),
        ("user", correction),
    )
    assert [bool(e.later) for e in entries] == [True, False, False]


@pytest.mark.parametrize(
    "word, number",
    [
        ("three", True),
        ("Twenty", True),
        ("thirty-one", True),
        ("sixty-eight", True),
        ("one", False),  # as often a pronoun: "the red one"
        ("one-off", False),
        ("well-known", False),
        ("two-thirds", False),
    ],
)
def test_a_cardinal_written_as_a_word_is_a_number(word, number):
    assert memory_reading.is_number_word(word) is number


def test_a_correction_that_puts_a_value_of_the_same_kind_in_place_links_to_the_old_one():
    entries = merged(
        ("user", "The interview is on Thursday the 14th at 2pm, competency-based."),
        ("user", "My sister Ana lives in Porto."),
        ("user", "They emailed: one of the panel is ill, so it's been moved to Friday the 21st."),
    )
    assert [bool(e.later) for e in entries] == [True, False, False]


def test_a_corrected_amount_replaces_the_amount_of_its_kind_not_another_number():
    # The bare numbers are alike to the embedding model; "$265" and "$210" are both dollars,
    # "7 kW" is not (memory_replaced.measured_values).
    entries = merged(
        ("user", "Our average electric bill is about $210 per month."),
        ("user", "Our neighbour Hector put in a 7 kW system last spring."),
        ("user", "Linda went through a year of statements; divided by twelve, it comes to $265."),
    )
    assert [bool(e.later) for e in entries] == [True, False, False]


@pytest.mark.parametrize(
    "newest_first, window, due",
    [
        # u3's answer a3 is in the window: u3 waits to be folded in with it.
        (["q", "a3", "u3", "a2", "u2", "a1", "u1"], 2, ["u1", "a1", "u2", "a2"]),
        # u3 was never answered (its request failed): nothing to wait for.
        (["q", "a3", "u4", "u3", "a2", "u2", "a1", "u1"], 3, ["u1", "a1", "u2", "a2", "u3"]),
    ],
)
def test_a_part_due_for_summary_never_ends_on_a_user_turn_whose_answer_follows(
    newest_first, window, due
):
    uncovered = [
        Turn(len(newest_first) - n, "user" if name[0] in "qu" else "assistant", f"{name} " * 30)
        for n, name in enumerate(newest_first)
    ]
    budget = sum(memory.estimate_tokens(turn.text) for turn in uncovered[:window])
    part = memory.due_for_summary(uncovered, budget=budget)
    assert [t.text.split()[0] for t in part] == due


def test_options_written_in_prose_and_taken_by_pointing_at_one_are_kept_with_them():
    options = (
        "A few neighbourhoods: Santo Stefano \u2014 elegant but expensive. Bolognina \u2014 just "
        "north of the station, lively and affordable. San Donato \u2014 residential, further out."
    )
    entries = merged(
        ("assistant", options),
        ("user", "Which is closest to the theatre by bike?"),
        ("assistant", "The northern one: about 10 minutes by bike."),
        ("user", "Sorry, was at rehearsal. Ok, I go for the one north of the station!"),
    )
    [took] = [e for e in entries if e.kind == memory_facts.TOOK]
    assert took.context == "1. Santo Stefano; 2. Bolognina; 3. San Donato"
    assert took.value == "Ok, I go for the one north of the station!"
    # Without options before it, "one" chooses nothing.
    entries = merged(("assistant", "Rain tomorrow, sadly."), ("user", "I have one brother, Tom."))
    assert [e.kind for e in entries] == [memory_facts.SAID]


def test_options_listed_in_one_sentence_between_semicolons_are_a_list():
    options = (
        "Some cakes that travel well: a lemon drizzle loaf, sturdy and easy to slice; a "
        "parkin, dark and sticky, better after a day or two; or a Victoria sponge, though the "
        "cream needs a cool bag. Any of them will survive the drive."
    )
    took = taken(options, "The sticky one, my dad loves treacle.")
    assert took.context == "1. a lemon drizzle loaf; 2. a parkin; 3. a Victoria sponge"
    assert took.value == "The sticky one, my dad loves treacle."
    # "or" before the last part makes two parts options; steps, remarks and code strung
    # together by semicolons offer nothing to choose from, and a reply to them takes nothing.
    assert proposal_of("Bake it tonight; or freeze it for Sunday.").heads == (
        "Bake it tonight",
        "freeze it for Sunday",
    )
    for text in (
        "Keep the loaf wrapped; it dries out fast.",
        "Your knee is likely tendinitis; rest it; see a doctor if it persists.",
        "The loaf keeps well; and it freezes too.",
        "Write it as for (int i = 0; i < n; i++) instead.",
        "Set it like this: color: red; margin: 0; padding: 4px.",
    ):
        assert proposal_of(text).heads == (), text
        assert [e.kind for e in merged(("assistant", text), ("user", "ok"))] == [], text


def test_options_called_by_a_label_and_an_index_keep_the_names_that_follow_the_label():
    options = (
        "Three routes from Christchurch:\n\nRoute A \u2013 Coastal Loop: Kaikoura, Nelson.\n"
        "Route B \u2013 Southern Lakes: Tekapo, Queenstown.\nRoute C \u2013 West Coast: glaciers."
    )
    entries = merged(("assistant", options), ("user", "We do the lakes one."))
    [took] = [e for e in entries if e.kind == memory_facts.TOOK]
    assert took.context == (
        "1. Route A \u2013 Coastal Loop; 2. Route B \u2013 Southern Lakes; "
        "3. Route C \u2013 West Coast"
    )


def test_a_labels_words_leave_the_name_after_it_its_own_words():
    options = (
        "Three ways down:\n**Option A \u2014 The N1 straight shot (via Bloemfontein)**\nFast.\n"
        "**Option B \u2014 Via Kimberley and the N12**\nThe Big Hole.\n"
        "**Option C \u2014 Scenic route via the Garden Route**\nLonger."
    )
    took = taken(options, "Option B please.")
    assert "2. Option B \u2013 Via Kimberley and the N12;" in took.context


def test_an_options_head_ends_with_its_first_sentence():
    options = (
        "Before you sand anything:\n1. **Respirator.** A P3 mask, not a paper one.\n"
        "2. **Ventilation.** Garage door open and a fan blowing out.\n"
        "3. **St. Albans dust sheets.** Cheap and they last."
    )
    assert proposal_of(options).heads == ("Respirator", "Ventilation", "St. Albans dust sheets")
    took = taken(options, "The second one, I have a fan already.")
    assert took.context == "1. Respirator; 2. Ventilation; 3. St. Albans dust sheets"


def test_a_reply_to_a_list_that_names_something_of_its_own_is_a_statement():
    tips = "Before you tow:\n1. Check the towing capacity\n2. Fit extension mirrors\n3. Service it"
    entries = merged(
        ("assistant", tips), ("user", "Ok update: we traded it in for a Suzuki Ertiga on Saturday!")
    )
    assert [(e.kind, e.value) for e in entries] == [
        (memory_facts.SAID, "Ok update: we traded it in for a Suzuki Ertiga on Saturday!")
    ]
    # Naming one of the options still takes the list, whatever else it names.
    bikes = "Three bikes:\n1. Trek FX 2\n2. Giant Escape 2\n3. Cube Nature"
    entries = merged(("assistant", bikes), ("user", "The Giant, Lotte rides one in Utrecht."))
    assert entries[0].kind == memory_facts.TOOK


def test_options_lettered_in_brackets_or_bulleted_with_dashes_are_a_list():
    for options in (
        "Three good bets:\n(a) 2018 Honda Fit: roomy.\n(b) 2017 Toyota Corolla: hard to kill.\n"
        "(c) 2019 Mazda3: fun to drive.",
        "Three good bets:\n\u2014 2018 Honda Fit: roomy.\n\u2014 2017 Toyota Corolla: hard to kill."
        "\n\u2014 2019 Mazda3: fun to drive.",
    ):
        entries = merged(("assistant", options), ("user", "ok the corolla then."))
        [took] = [e for e in entries if e.kind == memory_facts.TOOK]
        assert "2. 2017 Toyota Corolla" in took.context, options


def test_a_markdown_tables_rows_are_a_list_of_options():
    table = (
        "Three winter-ready options:\n| Campervan | Drive | Price/day |\n|---|:---:|---|\n"
        "| Lava Camper Duo | 2WD | \u20ac95 |\n| Fjord 4x4 Explorer | 4x4 | \u20ac140 |\n"
        "| Nordic Roamer Highland | 4x4 | \u20ac165 |\nThe Duo is cheapest, but 2WD is risky."
    )
    took = taken(table, "The last one please.")
    assert took.context == "1. Lava Camper Duo; 2. Fjord 4x4 Explorer; 3. Nordic Roamer Highland"


def test_a_choice_made_after_a_question_about_the_options_is_kept_with_them():
    options = (
        "Four beginner projects:\n1. Shaker side table: joinery.\n2. Dovetailed keepsake box: "
        "hand-cut joints.\n3. Adirondack chair: forgiving.\n4. Carved spoon: hand tools."
    )
    answer = "An Adirondack chair is mostly curved parts cut from templates, screwed together."
    for reply in (
        "ok the second then.",
        "I'd like to learn joinery, so let's do the keepsake box.",
    ):
        entries = merged(
            ("assistant", options),
            ("user", "What's involved with the Adirondack chair?"),
            ("assistant", answer),
            ("user", reply),
        )
        took = [e for e in entries if e.kind == "took"]
        assert len(took) == 1 and "2. Dovetailed keepsake box" in took[0].context, reply


def test_options_laid_out_as_headings_or_table_columns_are_a_list():
    headings = (
        "Three plans that could fit you:\n\n**1. Hanson Method (Beginner)**\n- 6 days a week.\n"
        "- Long run 26 km.\n\n**2. Pfitzinger 18/55**\n- 88 km a week.\n\n"
        "**3. Higdon Intermediate 1** \U0001f3c3\n- 5 days a week.\n- Two rest days."
    )
    columns = (
        "Three areas:\n| | **Croix-Rousse** | **Villeurbanne** | **Monplaisir** |\n"
        "|---|---|---|---|\n| Feel | hilltop village | modern | calm |\n"
        "| Rent | high | lower | mid |"
    )
    for options, listed in (
        (headings, "1. Hanson Method; 2. Pfitzinger 18/55; 3. Higdon Intermediate 1"),
        (columns, "1. Croix-Rousse; 2. Villeurbanne; 3. Monplaisir"),
    ):
        entries = merged(("assistant", options), ("user", "ok, sold. the third for me."))
        [took] = [e for e in entries if e.kind == memory_facts.TOOK]
        # The headings are the options, not the bullets under them.
        assert took.context == listed


def test_a_reply_to_a_list_is_read_by_its_first_clause_when_it_goes_on_to_give_reasons():
    options = "Three stories:\nA) The Payroll Mix-Up.\nB) The Angry Caller.\nC) The Rota Redesign."
    reply = "c i think, because i actually changed how we did things and people were annoyed"
    [took] = [e for e in merged(("assistant", options), ("user", reply)) if e.kind == "took"]
    assert "3. The Rota Redesign" in took.context and took.value.startswith("c i think")
    asked = "c or a, which one would you pick for a panel that cares about change and results?"
    assert not [e for e in merged(("assistant", options), ("user", asked)) if e.kind == "took"]


def test_a_name_the_user_said_first_is_no_proposal_when_the_assistant_repeats_it():
    turns = [
        ("user", "My friend Alasdair has a dodgy shoulder, so we want few locks."),
        ("assistant", "A week from Bradford on Avon means 20 to 40 locks; Alasdair can steer."),
        ("user", "Alasdair can steer and complain, he's good at both."),
    ]
    assert not [e for e in merged(*turns) if e.kind == memory_facts.TOOK]
    # A name the assistant proposed stays its proposal when the user asks about it first.
    asked = [
        (
            "assistant",
            "For a shower I'd use a premixed grout like Fusion Pro; it needs no sealing.",
        ),
        ("user", "How long does Fusion Pro take to cure?"),
        ("assistant", "About a week before heavy use; work in small sections."),
        ("user", "Fine, Fusion Pro it is then."),
    ]
    [took] = [e for e in merged(*asked) if e.kind == memory_facts.TOOK]
    assert "Fusion Pro" in took.context and took.value == "Fine, Fusion Pro it is then."


TRAVEL_OPTIONS = (
    "Three ways to get to the festival:\n1. Overnight sleeper train\n2. Budget coach with one "
    "change\n3. Hire a campervan and split petrol"
)
CAMPERVAN_COSTS = (
    "Roughly:\n- Rental: 90 pounds a day\n- Fuel: about 60 pounds each way\n- Excess cover: "
    "15 pounds a day"
)
COACH_DETAILS = "Usually:\n- Free wifi on most routes\n- A socket at every seat\n- Slow in traffic"


@pytest.mark.parametrize(
    "reply, option",
    [
        ("sleeper it is, I'd rather arrive rested.", "1. Overnight sleeper train"),
        ("Booked the campervan for the Thursday.", "3. Hire a campervan"),
        ("We'll take the petrol-splitting one with Dan's lot.", "3. Hire a campervan"),
    ],
)
def test_an_option_named_after_questions_answered_with_lists_is_kept_with_its_options(
    reply, option
):
    """Questions about the options were answered with lists of their own (costs, details): the
    choice names its option by a word no other option has, and is kept with the options."""
    entries = merged(
        ("assistant", TRAVEL_OPTIONS),
        ("user", "What would the campervan cost us with fuel?"),
        ("assistant", CAMPERVAN_COSTS),
        ("user", "And is there wifi on the coach?"),
        ("assistant", COACH_DETAILS),
        ("user", reply),
    )
    [took] = [e for e in entries if e.kind == memory_facts.TOOK]
    assert option in took.context and took.value == reply


def test_a_topic_talked_of_before_the_options_is_no_choice_among_them():
    entries = merged(
        ("user", "My brother drove us in his campervan last year and it broke down twice."),
        ("assistant", TRAVEL_OPTIONS),
        ("user", "Is there wifi on the coach?"),
        ("assistant", COACH_DETAILS),
        ("user", "Campervan rentals near us are all booked anyway."),
    )
    assert not [e for e in entries if "Overnight sleeper" in e.context]


@pytest.mark.parametrize(
    "reply",
    ["Decided, Dan books it tonight.", "Vamos con el tren de noche, Dan lo reserva hoy."],
)
def test_a_choice_the_assistant_answer_names_is_kept_with_its_options(reply):
    """The turn takes an option in words none of the options has (or in another language);
    the assistant's answer names it: the turn is kept with the list that offered it, not
    with the newer list of details."""
    entries = merged(
        ("assistant", TRAVEL_OPTIONS),
        ("user", "Is there wifi on the coach?"),
        ("assistant", COACH_DETAILS),
        ("user", reply),
        ("assistant", "Good call: the overnight sleeper train gets you there rested."),
    )
    [took] = [e for e in entries if e.kind == memory_facts.TOOK]
    assert "1. Overnight sleeper train" in took.context and took.value == reply


def test_an_answer_naming_several_options_or_one_asked_about_confirms_no_choice():
    compared = merged(
        ("assistant", TRAVEL_OPTIONS),
        ("user", "Decided, Dan books it tonight."),
        ("assistant", "The overnight sleeper train beats the budget coach on comfort."),
    )
    asked = merged(
        ("assistant", TRAVEL_OPTIONS),
        ("user", "Decided. Is the overnight sleeper train quiet?"),
        ("assistant", "Mostly: the overnight sleeper train has sleeping cabins."),
    )
    # Two of an option's words, but not as the option says them: a chance, not its name.
    by_chance = merged(
        ("assistant", TRAVEL_OPTIONS),
        ("user", "Decided, Dan books it tonight."),
        ("assistant", "Good. Hire whoever drives best and split the driving."),
    )
    assert not [e for e in compared + asked + by_chance if e.kind == memory_facts.TOOK]


def test_an_older_list_named_by_one_plain_word_of_the_answer_needs_the_user_to_point_at_it():
    """The answer's opening names an option of a list older than the newest by its only telling
    word: a chance as often as a choice, so the turn took it only if its own words point at it
    too; a statement about something else stays a statement."""
    # Written in lower case: no option's word is a name the assistant proposed.
    warmth = "Ways to stay warm:\n1. layers\n2. insulation\n3. heating"
    dinners = "Three dinners:\n1. Red lentil dal\n2. Chickpea curry\n3. Bean chilli"
    answer = "Insulation under a roof pays back fastest of all."

    def told(statement):
        return merged(
            ("assistant", warmth),
            ("user", "What should I cook this week?"),
            ("assistant", dinners),
            ("user", statement),
            ("assistant", answer),
        )

    elsewhere = "My flat is on the top floor, right under the roof."
    assert [e.kind for e in told(elsewhere) if e.value == elsewhere] == [memory_facts.SAID]
    # Not the turn's opening and no name: only the answer says which option it took.
    pointed = "The loft insulation gets sorted before anything else."
    [took] = [e for e in told(f"Right. {pointed}") if e.kind == memory_facts.TOOK]
    assert took.value == pointed and "2. insulation" in took.context


def test_a_reply_after_a_list_is_no_choice_when_the_answer_names_no_option():
    """Before the assistant answers, a short reply to a list may have taken one of its options in
    any words; once its answer names none, the reply took nothing (a list of tips)."""
    tips = "For shift work:\n- Ask for swap-friendly bookings\n- Keep a backup carer\n- Book early"
    reply = "changes every fortnight which is the annoying bit"
    unanswered = merged(("assistant", tips), ("user", reply))
    answered = merged(
        ("assistant", tips),
        ("user", reply),
        ("assistant", "That makes a fixed roster hard; ask the centre how they handle it."),
    )
    assert [e.kind for e in unanswered if e.value == reply] == [memory_facts.TOOK]
    assert [e.kind for e in answered if e.value == reply] == [memory_facts.SAID]


def test_a_reply_that_says_which_option_it_takes_outweighs_one_that_only_follows_a_list():
    steps = "To fix a puncture:\n1. Remove the wheel\n2. Find the cause\n3. Put in a new tube"
    bikes = "Three bikes:\n1. Trek FX 2\n2. Giant Escape 2\n3. Cube Nature"
    said = merged(("assistant", bikes), ("user", "ok going with the middle one."))
    followed = merged(("assistant", steps), ("user", "lol ok."))
    [chose] = [e for e in said if e.kind == memory_facts.TOOK]
    [only] = [e for e in followed if e.kind == memory_facts.TOOK]
    assert memory_facts.weight_of(chose) > memory_facts.weight_of(only) > 0
    # "That" after a list of options takes the whole answer, not one of them.
    plan = "Your days:\n1. Days 1-3 in Porto\n2. Days 4-5 in the Douro\n3. Day 6 in Coimbra"
    [liked] = [
        e for e in merged(("assistant", plan), ("user", "That looks smashing.")) if e.kind == "took"
    ]
    assert memory_facts.weight_of(chose) > memory_facts.weight_of(liked)


def test_only_grounded_summary_sentences_that_repeat_no_instruction_are_kept():
    said = "My name is Oriel and I keep bees.\nWe moved to Tartu last year. I'm hosting a party."
    answer = (
        "I'm glad to hear that you're enjoying your time at the local pub.\n"
        "The user mentioned a lunar eclipse that occurs every 18 months.\n"
        "The user asked about: bees, moving to Tartu.\n"
        "We moved to Tartu last year.\n"
        "The user'm hosting a party.\n"
        f"{memory_summary.SUMMARY_INSTRUCTIONS}\n"
        "You should visit Tallinn."
    )
    assert memory_summary.summary_text(previous="", answer=answer, said=said) == (
        "The user asked about: bees, moving to Tartu."
    )
    # A note about someone that names no one reads as the user's out of its turn.
    physio = "My physio Dana checked my knee. She says movement is good, and maybe he waits."
    notes = "She says movement is good.\nMaybe he waits.\nThe user's physio Dana says she likes it."
    assert memory_summary.summary_text(previous="", answer=notes, said=physio) == (
        "The user's physio Dana says she likes it."
    )
    # Nothing grounded: the notes so far stay.
    assert memory_summary.summary_text(previous="Old notes.", answer=answer[:66], said=said) == (
        "Old notes."
    )


def test_a_correction_in_other_words_is_never_shown_as_current(user, small_window):
    conversation = chat(user, ["I live in Tallinn.", "My gym locker code is 4471."], fillers=12)
    late = ["Quick update: we moved house last month, we're in Tartu now."]
    late += ["The gym reset all the lockers, so my new locker code is 9902."]
    for n, text in enumerate(late):
        message_create(conversation=conversation, role="user", text=text)
        message_create(conversation=conversation, role="assistant", request_id=f"b{n}", text="Ok.")
    for n in range(12):
        message_create(conversation=conversation, role="user", text=FILLER.format(n=n))
        message_create(
            conversation=conversation, role="assistant", request_id=f"c{n}", text=ANSWER.format(n=n)
        )
    message_create(conversation=conversation, role="user", text="Where do I live?")
    # A summary written before the corrections still says the old values.
    first_answer = conversation.messages.get(request_id="a3")
    memory_summary.summary_store(
        conversation_id=conversation.id,
        upto_message_id=first_answer.id,
        text="The user lives in Tallinn.\nThe user's gym locker code is 4471.",
    )
    memory_block = system_of(conversation).split("\n\n", 1)[1]
    assert 'Earlier: "I live in Tallinn."' in memory_block
    assert 'Earlier: "My gym locker code is 4471."' in memory_block
    assert "we're in Tartu now." in memory_block and "my new locker code is 9902." in memory_block
    assert "The user lives in Tallinn." not in memory_block  # the summary's stale sentence
    assert "code is 4471." not in memory_block.replace('code is 4471."', "")


def test_a_correction_in_the_turns_sent_whole_bars_the_summarys_old_value():
    early = ["I live in Tallinn.", *(FILLER.format(n=n) for n in range(12))]
    late = ["Quick update: we moved house last month, we're in Tartu now.", "Thanks."]
    history, n = [], 0
    for text in [*early, *late]:
        history += [Turn(n + 1, "user", text), Turn(n + 2, "assistant", ANSWER.format(n=n))]
        n += 2
    history.append(Turn(n + 1, "user", "Where do I live?"))
    folded = history[: 2 * len(early)]  # what the summary covers, and its row's statements
    facts = memory_facts.merge([], folded, newer=lambda a, b: a > b)
    sources = PromptSources(
        history=list(reversed(history)),
        profile=None,
        summary="The user lives in Tallinn.\nThe user asked about rivers.",
        summary_upto=folded[-1].id,
        facts=memory_facts.entries_to_json(facts),
    )
    plan = memory.plan_prompt(system="S", sources=sources, budget=900)
    sent = " ".join(m["content"] for m in plan.turns)
    assert "we're in Tartu now" in sent  # the correction is in the turns sent whole...
    assert plan.remembered.summary == ["The user asked about rivers."]  # ...and bars Tallinn
    assert 'Earlier: "I live in Tallinn."' in plan.system


def test_a_summary_sentence_naming_a_replaced_value_with_digits_in_a_word_is_dropped():
    entries = merged(
        ("user", "target is a 2TB usb drive plugged into the pi."),
        ("user", "wait no, just checked the label, the drive is 4TB not what i said."),
    )
    summary = "target is a 2TB usb drive plugged into the pi.\nThe user asked about backups."
    assert memory_summary_lines.summary_lines(summary, entries) == ["The user asked about backups."]


def test_the_memory_block_has_a_budget_and_keeps_the_most_telling_in_order():
    said = [
        f"My friend told me a long story about pilots and planes ({'ha' * n})." for n in range(30)
    ]
    said += ["I live in Tartu.", "My cat is called Miso.", "I'm allergic to peanuts."]
    history = [Turn(n + 1, "user", text) for n, text in enumerate(said)]
    history.append(Turn(len(history) + 1, "user", "What do you know about me?"))
    sources = PromptSources(history=list(reversed(history)), profile=None)
    entries = memory.entries_for(sources)
    block = memory.remembered(sources=sources, entries=entries, budget=120, pinned=[])
    values = [e.value for e in block.facts]
    # A name or the user as subject tells more than a story of a friend's.
    assert {"I live in Tartu.", "My cat is called Miso.", "I'm allergic to peanuts."} <= set(values)
    assert block.left_out == len(entries) - len(values) > 0
    assert values == [e.value for e in entries if e.value in values]  # in the order said
    assert memory.estimate_tokens(block.text) <= 120 + 40  # the heading beside the lines


def test_the_note_shows_the_prompts_memory_and_the_user_corrects_and_deletes_entries(
    user, other_user, client_for, small_window
):
    conversation = chat(user, ["I live in Tallinn.", "My boss has a cat called Mochi."])
    page = client_for(user).get(f"/c/{conversation.id}/").content.decode()
    system = system_of(conversation)
    assert "&quot;I live in Tallinn.&quot;" in page and '"I live in Tallinn."' in system
    assert "boss has a cat called Mochi." in page and "boss has a cat called Mochi." in system
    entries = memory.entries_for(sources_of(conversation))
    city = next(e.key for e in entries if "Tallinn" in e.value)
    boss = next(e.key for e in entries if "boss" in e.value)
    url = f"/c/{conversation.id}/memory/"
    assert client_for(other_user).post(url, {"key": city, "value": "Oslo"}).status_code == 404

    edit = {"key": city, "value": "I live in Tartu.", "action": "save"}
    response = client_for(user).post(url, edit)
    assert response.status_code == 302 and response["Location"].endswith("?memory=1#memory-note")
    system = system_of(conversation)
    assert '"I live in Tartu." (as the user corrected it)' in system
    assert "Tallinn" not in system.split("\n\n", 1)[1]
    client_for(user).post(url, {"key": boss, "action": "delete"})
    system = system_of(conversation)
    assert "Mochi" not in system
    page = client_for(user).get(f"/c/{conversation.id}/?memory=1").content.decode()
    assert "I live in Tartu." in page and "Mochi" not in page.split("memory-note")[1]

    # A later turn says otherwise: the user's own words reach the prompt after the edit. That
    # turn is among those sent whole, so the memory block does not repeat it.
    message_create(conversation=conversation, role="user", text="We moved to Riga last week.")
    message_create(conversation=conversation, role="user", text="What now?")
    messages = prompt_build(conversation=conversation).messages
    memory_block = messages[0]["content"].split("\n\n", 1)[1]
    assert "I live in Tartu." in memory_block and "Riga" not in memory_block
    assert [m["content"] for m in messages[-2:]] == ["We moved to Riga last week.", "What now?"]


def test_a_statement_the_prompt_sends_whole_is_not_repeated_in_the_memory_block(user, small_window):
    """The block's room goes to what fell out of the window: a statement of a recent turn is
    read there, once, while an old one is kept in the block."""
    conversation = chat(user, ["I live in Tallinn."])
    message_create(conversation=conversation, role="user", text="I keep bees on the roof.")
    message_create(conversation=conversation, role="assistant", text="Bees need water nearby.")
    message_create(conversation=conversation, role="user", text="What now?")
    messages = prompt_build(conversation=conversation).messages
    assert '"I live in Tallinn."' in messages[0]["content"]
    assert sum("I keep bees on the roof." in m["content"] for m in messages) == 1
    assert messages[-3]["content"] == "I keep bees on the roof."


def sources_of(conversation):
    return prompt_sources(conversation=conversation, limit=100)


def test_the_note_says_summary_pending_until_it_is_written(
    user, client_for, small_window, settings
):
    settings.SLUICE_ADMISSION = True
    conversation = chat(user, ["My name is Oriel and my locker code is 4471."])
    prompt = prompt_build(conversation=conversation)
    request_id = background.summary_schedule(conversation=conversation, prompt=prompt)
    page = client_for(user).get(f"/c/{conversation.id}/").content.decode()
    assert "summary pending" in page
    record_answer(request_id, user.id, "The user asked about river number 3.")
    page = client_for(user).get(f"/c/{conversation.id}/").content.decode()
    assert "summary pending" not in page and "The user asked about river number 3." in page


def test_an_edit_keeps_a_summary_whose_last_turn_comes_before_the_edited_question(user):
    conversation = chat_with_an_answer_stored_after_the_next_question(user)
    late_answer = conversation.messages.get(request_id="a10")
    next_question = conversation.messages.get(text__startswith="Tell me about river number 11 ")
    assert late_answer.id > next_question.id  # stored later, said earlier
    memory_summary.summary_store(
        conversation_id=conversation.id, upto_message_id=late_answer.id, text="Rivers 0 to 10."
    )
    turns.message_edit(
        user=user, conversation=conversation, message_id=next_question.id, text="And river 12?"
    )
    summary = ConversationSummary.objects.get(conversation=conversation)  # still there
    assert summary.upto_message_id == late_answer.id
    # An edit of a question the summary covers discards it (once that answer has ended).
    get_redis().delete(keys().conversation_active(conversation.id))
    ten = conversation.messages.get(text__startswith="Tell me about river number 10 ")
    turns.message_edit(user=user, conversation=conversation, message_id=ten.id, text="Hi?")
    assert not ConversationSummary.objects.filter(conversation=conversation).exists()


def test_an_export_counts_the_turns_a_summary_covers_in_the_conversations_order(user):
    conversation = chat_with_an_answer_stored_after_the_next_question(user)
    next_question = conversation.messages.get(text__startswith="Tell me about river number 11 ")
    memory_summary.summary_store(
        conversation_id=conversation.id, upto_message_id=next_question.id, text="Rivers 0 to 11."
    )
    ordered = list(conversation.messages.order_by("created", "id"))
    data = conversation_export_data(conversation=conversation)
    assert data["summary"]["covers"] == ordered.index(next_question) + 1
    copy = conversation_import(owner=user, data=data)
    upto = Message.objects.get(id=copy.summary.upto_message_id)
    assert upto.text == next_question.text and upto.role == "user"
