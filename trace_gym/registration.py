"""Every ``trace/*`` id, as data. Registered through gymnasium's own registry when ``trace_gym`` is imported;
entry points are strings, so registering imports no env module, builds no index and loads no data."""

from __future__ import annotations

from typing import Any

import gymnasium as gym

# id -> (entry point, constructor kwargs)
_QA = "trace_gym.environments.qa.env:MultiHopQAEnv"
_MATH = "trace_gym.environments.math.env:MathEnv"
_BFCL_MT = "trace_gym.environments.bfcl.env:BFCLMultiTurnEnv"
_BFCL_ST = "trace_gym.environments.bfcl.env:BFCLSingleTurnEnv"
ENV_SPECS: dict[str, tuple[str, dict[str, Any]]] = {
    "trace/HotpotQA-v0": (_QA, {"dataset": "hotpotqa"}),
    "trace/2Wiki-v0": (_QA, {"dataset": "2wiki"}),
    "trace/MuSiQue-v0": (_QA, {"dataset": "musique"}),
    "trace/Bamboogle-v0": (_QA, {"dataset": "bamboogle"}),
    "trace/Math-v0": (_MATH, {"dataset": "deepscaler"}),
    "trace/GSM8K-v0": (_MATH, {"dataset": "gsm8k"}),
    "trace/MATH500-v0": (_MATH, {"dataset": "math500"}),
    "trace/AIME24-v0": (_MATH, {"dataset": "aime24"}),
    "trace/AMC23-v0": (_MATH, {"dataset": "amc23"}),
    "trace/Arithmetic-v0": ("trace_gym.environments.math.env:ArithmeticEnv", {}),  # defaults = level 3
    "trace/ArithmeticChain-v0": ("trace_gym.environments.math.chain:ChainEnv", {}),
    "trace/BFCL-v0": (_BFCL_MT, {"category": "multi_turn_base"}),
    "trace/BFCL-MultiTurn-Base-v0": (_BFCL_MT, {"category": "multi_turn_base"}),
    "trace/BFCL-MultiTurn-MissFunc-v0": (_BFCL_MT, {"category": "multi_turn_miss_func"}),
    "trace/BFCL-MultiTurn-MissParam-v0": (_BFCL_MT, {"category": "multi_turn_miss_param"}),
    "trace/BFCL-MultiTurn-LongContext-v0": (_BFCL_MT, {"category": "multi_turn_long_context"}),
    "trace/BFCL-Simple-v0": (_BFCL_ST, {"category": "simple_python"}),
    "trace/BFCL-Multiple-v0": (_BFCL_ST, {"category": "multiple"}),
    "trace/BFCL-Parallel-v0": (_BFCL_ST, {"category": "parallel"}),
    "trace/BFCL-ParallelMultiple-v0": (_BFCL_ST, {"category": "parallel_multiple"}),
    "trace/BFCL-Irrelevance-v0": (_BFCL_ST, {"category": "irrelevance"}),
}


def register_envs() -> None:
    """Register every id in ``ENV_SPECS`` that gymnasium does not know yet (idempotent)."""
    for env_id, (entry_point, kwargs) in ENV_SPECS.items():
        if env_id not in gym.registry:
            gym.register(env_id, entry_point=entry_point, kwargs=kwargs)


def trace_env_ids() -> list[str]:
    return sorted(ENV_SPECS)
