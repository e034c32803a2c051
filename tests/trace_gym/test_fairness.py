"""The turn order of shared work: the owner with the fewest items in service first, ties to the one served
longest ago (never served first of all), then the same among that owner's sessions, then arrival."""

import pytest

from trace_gym.fairness import Client, FairQueue, current_client, on_behalf_of

HOG = [Client("hog", f"s{i}") for i in range(4)]
OTHER = Client("other", "x")


def test_an_owner_with_nothing_in_service_goes_before_one_that_holds_every_server():
    queue: FairQueue[str] = FairQueue()
    for i, client in enumerate(HOG[:2]):
        queue.push(client, f"held{i}")
    assert [queue.pop()[1] for _ in range(2)] == ["held0", "held1"]  # the hog holds both servers
    for i, client in enumerate(HOG[2:]):
        queue.push(client, f"queued{i}")
    queue.push(OTHER, "other")  # arrives last
    queue.done(HOG[0])  # a server frees
    assert queue.pop() == (OTHER, "other")
    assert [queue.pop()[1] for _ in range(2)] == ["queued0", "queued1"]


def test_owners_with_as_much_in_service_take_turns_and_a_new_one_goes_first():
    queue: FairQueue[str] = FairQueue()
    for name in ("a", "b"):
        for i in range(2):
            queue.push(Client(name, "s"), f"{name}{i}")
    order = []
    for _ in range(4):
        client, item = queue.pop()
        order.append(item)
        queue.done(client)
        if item == "b0":
            queue.push(Client("c", "s"), "c0")
    assert order == ["a0", "b0", "c0", "a1"]  # c, never served, before a and b; then a, served longest ago
    assert queue.pop()[1] == "b1" and len(queue) == 0


def test_within_an_owner_its_sessions_take_turns():
    queue: FairQueue[str] = FairQueue()
    for item in ("s0-a", "s0-b", "s0-c"):
        queue.push(HOG[0], item)
    queue.push(HOG[1], "s1-a")
    order = []
    for _ in range(4):
        client, item = queue.pop()
        order.append(item)
        queue.done(client)
    assert order == ["s0-a", "s1-a", "s0-b", "s0-c"]


def test_a_waiter_that_gives_up_leaves_the_queue_unless_it_was_served():
    queue: FairQueue[str] = FairQueue()
    queue.push(OTHER, "gone")
    assert queue.remove(OTHER, "gone") and len(queue) == 0
    queue.push(OTHER, "served")
    queue.pop()
    assert not queue.remove(OTHER, "served")
    with pytest.raises(IndexError):
        queue.pop()


def test_work_is_done_on_behalf_of_one_client_at_a_time():
    assert current_client() == Client("", "")
    with on_behalf_of(OTHER):
        assert current_client() == OTHER
        with on_behalf_of(HOG[0]):
            assert current_client() == HOG[0]
        assert current_client() == OTHER
    assert current_client() == Client("", "")
