"""The base classes' plumbing: what every episode starts from, whatever a subclass's hooks do."""

from __future__ import annotations

from trace_gym import Task, TextEnv, Turn


class EchoTurns(TextEnv):
    """A ``begin`` that leaves ``messages`` alone, as a subclass may write it."""

    def begin(self, task: Task) -> str:
        return task.prompt

    def turn(self, action: str) -> Turn:
        return Turn(f"heard {action}")


def test_every_episode_starts_with_fresh_messages() -> None:
    env = EchoTurns(tasks=[Task(id="a", prompt="first"), Task(id="b", prompt="second")], max_turns=3)
    env.reset(options={"index": 0})
    env.step("from episode one")
    _, info = env.reset(options={"index": 1})
    assert info["messages"] == []
    *_, info = env.step("from episode two")
    assert [m["content"] for m in info["messages"]] == ["from episode two", "heard from episode two"]
