"""The jail: a persistent, forkable, jailed Python interpreter (``PythonSandbox``) and bounded calls
(``bounded_call``) for untrusted work an env must do itself. See docs/sandbox.md for the threat model."""
