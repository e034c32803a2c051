"""trace-gym: Gymnasium environments and tree rollouts for RL on multi-turn tool-use LLM agents.

``import trace_gym`` registers every ``trace/*`` id with gymnasium (cheaply: string entry points only).
"""

from trace_gym.actions import ActionParser, HermesParser, ParsedAction, TagParser, ToolCall
from trace_gym.env import TextEnv, ToolEnv, Turn
from trace_gym.errors import (
    ConfigError,
    DataError,
    ServerError,
    SnapshotError,
    ToolError,
    TraceGymError,
    UserError,
)
from trace_gym.experts import Expert
from trace_gym.registration import register_envs, trace_env_ids
from trace_gym.snapshot import NativeSnapshot, ReplaySnapshot, Snapshot
from trace_gym.spaces import String
from trace_gym.tasks import Task
from trace_gym.tools import Tool, call_tool
from trace_gym.tree import Node, RolloutTree
from trace_gym.wrappers import TreeRolloutWrapper

__version__ = "0.1.0"

__all__ = [
    "ActionParser", "ConfigError", "DataError", "Expert", "HermesParser", "NativeSnapshot", "Node",
    "ParsedAction", "ReplaySnapshot", "RolloutTree", "ServerError", "Snapshot", "SnapshotError", "String", "TagParser",
    "Task", "TextEnv", "Tool", "ToolCall", "ToolEnv", "ToolError", "TraceGymError", "TreeRolloutWrapper", "Turn",
    "UserError", "call_tool", "register_envs", "trace_env_ids",
]

register_envs()
