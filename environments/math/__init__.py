"""Math with a sandboxed Python tool: the envs (real sets and the procedural arithmetic family), answer
checking and the scripted experts."""
