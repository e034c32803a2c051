"""The env server's request and answer bodies: OpenEnv's HTTP and WebSocket shapes (openenv-core 0.3.0:
``ResetRequest``, ``StepRequest``, ``{observation, reward, done}``, ``State``, ``/schema``'s three schemas,
``/metadata``, ``/health``), filled with a trace-gym env's turns, and the bodies of the branching extensions.

Requests forbid fields they do not name: a client chooses a task (``task_id``, ``index`` or ``seed``) and plays
turns; the env, its arguments and its data are the operator's.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

__all__ = ["EnvResult", "EpisodeState", "HandleRequest", "HandleResponse", "Health", "Metadata", "ResetRequest",
           "Schemas", "StepRequest", "TurnAction", "TurnObservation"]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ResetRequest(_Strict):
    """Start an episode: the task ``task_id``, else the ``index``-th, else one drawn with ``seed``."""

    seed: int | None = Field(default=None, ge=0, description="random seed of the task draw")
    episode_id: str | None = Field(default=None, max_length=255, description="the client's name for the episode")
    task_id: str | None = Field(default=None, max_length=1024, description="a task id of the served env's dataset")
    index: int | None = Field(default=None, ge=0, description="a task's position in the dataset (modulo its size)")


class TurnAction(_Strict):
    """One assistant turn, as the env's parser reads it (tool calls, an answer, or anything: a malformed turn is
    the env's error observation)."""

    message: str = Field(description="the assistant's turn, as text")
    metadata: dict[str, Any] = Field(default_factory=dict, description="ignored by the env")


class StepRequest(_Strict):
    """OpenEnv's step request; ``timeout_s`` is accepted and left to the env's own bounds on a turn."""

    action: TurnAction
    timeout_s: float | None = Field(default=None, gt=0)
    request_id: str | None = Field(default=None, max_length=255)


class TurnObservation(BaseModel):
    """What the env answered: its observation text and the chat messages it added (on a reset or a restore, the
    whole chat so far), the task, the turn count, how the episode stands, and the turn's info."""

    text: str
    messages: list[dict[str, Any]]
    task_id: str | None = None
    turn: int = 0
    terminated: bool = False
    truncated: bool = False
    tools: list[dict[str, Any]] = Field(default_factory=list, description="the tools' schemas (on reset)")
    info: dict[str, Any] = Field(default_factory=dict)


class EnvResult(BaseModel):
    """OpenEnv's ``ResetResponse`` and ``StepResponse``: ``reward`` is None until the episode's last turn scores."""

    observation: TurnObservation
    reward: float | None = None
    done: bool = False


class EpisodeState(BaseModel):
    """OpenEnv's ``State`` (``episode_id``, ``step_count``) with the task, whether it ended, and the whole chat."""

    episode_id: str | None = None
    step_count: int = 0
    task_id: str | None = None
    done: bool = False
    messages: list[dict[str, Any]] = Field(default_factory=list)


class HandleRequest(_Strict):
    snapshot: str = Field(max_length=100, description="a handle that POST /snapshot returned for the same session")


class HandleResponse(BaseModel):
    snapshot: str


class Health(BaseModel):
    status: Literal["healthy"] = "healthy"


class Metadata(BaseModel):
    name: str
    description: str
    version: str | None = None
    author: str | None = None
    documentation_url: str | None = None
    readme_content: str | None = None


class Schemas(BaseModel):
    action: dict[str, Any]
    observation: dict[str, Any]
    state: dict[str, Any]
