import pickle

from trace_gym import String


def test_contains_any_unicode_up_to_max_length():
    space = String(max_length=10)
    assert space.contains("héllo 漢字\n")
    assert not space.contains("x" * 11)
    assert not space.contains(b"bytes")


def test_samples_are_members_and_seeded():
    a, b = String(seed=3), String(seed=3)
    samples = [a.sample() for _ in range(20)]
    assert samples == [b.sample() for _ in range(20)]
    assert all(a.contains(s) for s in samples)


def test_pickles_small():
    assert len(pickle.dumps(String())) < 2000
