"""BFCL v4 function-calling environments (multi-turn executable and single-turn AST categories)."""
