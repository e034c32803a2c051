"""BFCL v4 function-calling environments: executable multi-turn categories and single-turn AST categories.

Needs bfcl-eval's backend classes: `pip install --no-deps bfcl-eval==2026.3.23 mpmath`. Left out offline:
web_search (live search API) and memory (its vector backend downloads a hub model at import)."""

from trace_gym.environments.bfcl.env import BFCLMultiTurnEnv, BFCLSingleTurnEnv
from trace_gym.environments.bfcl.expert import BFCLExpert

__all__ = ["BFCLExpert", "BFCLMultiTurnEnv", "BFCLSingleTurnEnv"]
