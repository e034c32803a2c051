"""Concrete trace-gym environments (installed as ``trace_gym.environments``): multi-hop QA with BM25 search,
math with a sandboxed Python tool, and BFCL function calling. Modules are imported by their registered entry
points only when an env is made, so ``import trace_gym`` stays cheap."""
