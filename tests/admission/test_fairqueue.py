"""Deficit round robin: nothing lost or duplicated, each user's order kept, a flood cannot
starve a light user."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from apps.admission.fairqueue import Entry, FairQueue

entries = st.lists(
    st.tuples(st.sampled_from("abcd"), st.integers(1, 2000), st.sampled_from([0.5, 1.0, 4.0])),
    max_size=80,
)


@given(entries=entries, quantum=st.integers(1, 1000))
def test_every_entry_leaves_once_in_each_users_order(entries, quantum):
    queue = FairQueue(quantum=quantum)
    for i, (user, cost, weight) in enumerate(entries):
        queue.push(Entry(f"{user}{i}", user, cost, weight))
    predicted = [e.id for e in queue.order()]
    popped = []
    while (entry := queue.pop()) is not None:
        popped.append(entry.id)
    assert popped == predicted  # positions told to users are the real release order
    assert sorted(popped) == sorted(f"{u}{i}" for i, (u, _, _) in enumerate(entries))
    for user in "abcd":
        mine = [p for p in popped if p.startswith(user)]
        assert mine == sorted(mine, key=lambda p: int(p[1:]))
    assert len(queue) == 0


@given(
    entries=entries,
    quantum=st.integers(1, 1000),
    popped=st.integers(0, 40),
    removed=st.lists(st.integers(0, 79), max_size=10),
)
def test_the_whole_line_in_closed_form_is_the_release_order(entries, quantum, popped, removed):
    queue = FairQueue(quantum=quantum)
    for i, (user, cost, weight) in enumerate(entries):
        queue.push(Entry(f"{user}{i}", user, cost, weight))
    # Part-way through: deficits carried, a user in the middle of its turn, gaps left by stops.
    for _ in range(popped):
        queue.pop()
    for i in removed:
        if i < len(entries):
            queue.remove(f"{entries[i][0]}{i}")
    line = queue.release_order()
    assert line == [e.id for e in queue.order()]
    released = []
    while (entry := queue.pop()) is not None:
        released.append(entry.id)
    assert released == line


@given(cost=st.integers(50, 1500), flood=st.integers(1, 100), served=st.integers(0, 10))
def test_a_flood_delays_a_light_user_by_about_one_request(cost, flood, served):
    queue = FairQueue(quantum=256)
    for i in range(flood):
        queue.push(Entry(f"f{i}", "flood", cost))
    for _ in range(min(served, flood)):
        queue.pop()  # the flood has been running for a while
    queue.push(Entry("light", "light", cost))
    order = [e.id for e in queue.order()]
    ahead = order.index("light")
    # Work ahead of the light request, in tokens (service time follows tokens): at most one
    # turn's quantum plus one request, so a single request when requests outweigh the quantum.
    assert ahead * cost <= 256 + cost
    if cost >= 256:
        assert ahead <= 1


def test_weights_share_releases_by_plan_weight():
    queue = FairQueue(quantum=100)
    for i in range(200):
        queue.push(Entry(f"p{i}", "pro", 100, 4.0))
        queue.push(Entry(f"f{i}", "free", 100, 1.0))
    first = [queue.pop().user for _ in range(100)]
    assert first.count("pro") == 80


def test_ineligible_users_are_skipped_and_removal_works():
    queue = FairQueue(quantum=10)
    queue.push(Entry("a1", "a", 10))
    queue.push(Entry("b1", "b", 10))
    assert queue.pop(lambda user: user != "a").id == "b1"
    assert queue.pop(lambda user: False) is None
    assert queue.remove("a1").id == "a1"
    assert queue.pop() is None


@given(
    entries=st.lists(
        st.tuples(st.sampled_from("abcd"), st.integers(1, 2000), st.booleans()), max_size=60
    ),
    blocked=st.sets(st.sampled_from("abcd"), max_size=3),
)
def test_background_entries_leave_only_when_no_persons_entry_may(entries, blocked):
    from apps.admission.fairqueue import BACKGROUND, PEOPLE

    queue = FairQueue(quantum=256)
    for i, (user, cost, background) in enumerate(entries):
        queue.push(Entry(f"{i}", user, cost, 1.0, BACKGROUND if background else PEOPLE))
    people = {f"{i}" for i, (_, _, background) in enumerate(entries) if not background}
    may_run = lambda user: user not in blocked  # noqa: E731  (users at their concurrency limit)
    order = [e.id for e in queue.order(may_run)]
    popped = []
    while (entry := queue.pop(may_run)) is not None:
        # A background entry leaves only when no runnable person's entry is left.
        if entry.id not in people:
            assert not any(p in queue and entries[int(p)][0] not in blocked for p in people)
        popped.append(entry.id)
    assert popped == order
    assert set(queue.release_order()) == {f"{i}" for i, e in enumerate(entries) if e[0] in blocked}
