"""The account forms against someone who hammers them or fishes for accounts: every form
answers 429 past its limit from one address, and a known and an unknown address get the same
words and take the same time (sign-up, password reset, sign-in)."""

from __future__ import annotations

import re
import statistics
import time

import pytest
from allauth.account.models import EmailAddress
from django.test import Client

from apps.accounts.services import user_create

pytestmark = pytest.mark.django_db

PASSPHRASE = "a-long-passphrase-9"
TRIES = 20


def signup(client: Client, n: int, email: str):
    return client.post(
        "/accounts/signup/",
        {
            "username": f"newcomer{n}",
            "email": email,
            "password1": PASSPHRASE,
            "password2": PASSPHRASE,
        },
    )


def reset(client: Client, email: str):
    return client.post("/accounts/password/reset/", {"email": email})


def login(client: Client, username: str):
    return client.post("/accounts/login/", {"username": username, "password": "wrong-pass"})


FORMS = {
    "sign-up": lambda client, n: signup(client, n, f"person{n}@example.org"),
    "password reset": lambda client, n: reset(client, f"person{n}@example.org"),
    "sign-in": lambda client, n: login(client, f"person{n}"),
}


@pytest.mark.parametrize("form", FORMS)
def test_each_form_answers_429_past_its_limit_from_one_address(form, verification_required):
    client = Client()
    statuses = [FORMS[form](client, n).status_code for n in range(TRIES + 5)]
    assert 429 not in statuses[:TRIES], statuses
    assert statuses[TRIES:] == [429] * 5, statuses
    # Another address is not held back by the first one's tries.
    assert FORMS[form](Client(REMOTE_ADDR="10.1.2.3"), 99).status_code != 429


def visible(response) -> str:
    """A page's words, without what differs by request (tokens) or by the input echoed."""
    text = re.sub(
        r'(csrfmiddlewaretoken" value="|X-CSRFToken": ")[^"]+', "", response.content.decode()
    )
    return re.sub(r"[\w.+-]+@example\.org", "ADDRESS", text)


def median_ms(durations: list[float]) -> float:
    return statistics.median(durations) * 1000


# A known and an unknown address take the same time when the median of their paired
# differences (each pair posted back to back, so a slow moment of the machine hits both) stays
# under the larger of these: a step skipped for one of them, such as hashing the password,
# takes most of a post and shows far above both, while a loaded machine's noise grows with
# the time a post takes.
SAME_TIME_MS = 50
SAME_TIME_SHARE = 0.15


def time_gap_ms(known_times: list[float], unknown_times: list[float]) -> tuple[float, float]:
    """The median paired difference of the two, and the bound it must stay under (ms)."""
    paired = statistics.median(k - u for k, u in zip(known_times, unknown_times, strict=True))
    bound = max(SAME_TIME_MS, SAME_TIME_SHARE * median_ms(known_times + unknown_times))
    return abs(paired) * 1000, bound


def timed(post, *args) -> tuple[float, object]:
    """One post's answer and how long it took, the client made beforehand."""
    client = Client()
    start = time.perf_counter()
    response = post(client, *args)
    return time.perf_counter() - start, response


@pytest.fixture
def unthrottled(settings):
    """The timing is of each form's own work: its rate limits stay out of the way."""
    settings.ACCOUNT_RATE_LIMITS = False
    settings.LOGIN_THROTTLE_ATTEMPTS = 10_000


def known_people(count: int) -> list[str]:
    emails = []
    for n in range(count):
        user = user_create(username=f"known{n}", password=PASSPHRASE, email=f"known{n}@example.org")
        EmailAddress.objects.create(user=user, email=user.email, verified=True, primary=True)
        emails.append(user.email)
    return emails


def test_password_reset_says_and_takes_the_same_for_known_and_unknown(unthrottled, smtp_mail):
    known = known_people(TRIES)
    known_times, unknown_times = [], []
    for n in range(TRIES):  # interleaved, so a slow moment of the machine hits both alike
        took, known_answer = timed(reset, known[n])
        known_times.append(took)
        took, unknown_answer = timed(reset, f"stranger{n}@example.org")
        unknown_times.append(took)
        assert known_answer.status_code == unknown_answer.status_code == 302
        assert known_answer["Location"] == unknown_answer["Location"]
    done = Client().get(known_answer["Location"])
    assert "ADDRESS" not in visible(done)
    # Both get a mail: the link to one, a "you have no account here" to the other.
    assert smtp_mail.count_to(known[0]) == 1 and smtp_mail.count_to("stranger0@example.org") == 1
    gap, bound = time_gap_ms(known_times, unknown_times)
    print(
        f"password reset: known {median_ms(known_times):.1f} ms, unknown "
        f"{median_ms(unknown_times):.1f} ms (median of {TRIES}), paired gap {gap:.1f} ms "
        f"(bound {bound:.0f})"
    )
    assert gap < bound


def test_sign_up_says_and_takes_the_same_for_a_taken_and_a_free_address(
    unthrottled, verification_required, smtp_mail
):
    known = known_people(TRIES)
    known_times, unknown_times, pages = [], [], set()
    for n in range(TRIES):
        took, taken = timed(signup, 100 + n, known[n])
        known_times.append(took)
        took, free = timed(signup, 200 + n, f"fresh{n}@example.org")
        unknown_times.append(took)
        assert taken.status_code == free.status_code == 302
        assert taken["Location"] == free["Location"]
    for response in (taken, free):
        pages.add(visible(Client().get(response["Location"])))
    assert len(pages) == 1
    assert smtp_mail.count_to(known[0]) == 1  # "you already have an account"
    gap, bound = time_gap_ms(known_times, unknown_times)
    print(
        f"sign-up: taken {median_ms(known_times):.1f} ms, free {median_ms(unknown_times):.1f} ms "
        f"(median of {TRIES}), paired gap {gap:.1f} ms (bound {bound:.0f})"
    )
    assert gap < bound


def test_sign_in_says_and_takes_the_same_for_a_known_and_an_unknown_name(unthrottled):
    known_people(TRIES)
    known_times, unknown_times = [], []
    for n in range(TRIES):
        took, real = timed(login, f"known{n}")
        known_times.append(took)
        took, ghost = timed(login, f"ghost{n}")
        unknown_times.append(took)
    assert real.status_code == ghost.status_code == 200
    assert visible(real).replace(f"known{TRIES - 1}", "X") == visible(ghost).replace(
        f"ghost{TRIES - 1}", "X"
    )
    gap, bound = time_gap_ms(known_times, unknown_times)
    print(
        f"sign-in: known {median_ms(known_times):.1f} ms, unknown "
        f"{median_ms(unknown_times):.1f} ms (median of {TRIES}), paired gap {gap:.1f} ms "
        f"(bound {bound:.0f})"
    )
    assert gap < bound
