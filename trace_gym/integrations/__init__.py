"""trace-gym envs in other trainers' env interfaces, and an env server any process can branch through.

=====================  ==========================================================================================
module                 what it gives
=====================  ==========================================================================================
``session``            `EnvSession`: one env played by text turns from outside, snapshots by handle (stdlib)
``env_server``         an HTTP server of sessions (reset, step, snapshot, restore, release, close) and its client
``skyrl_env``          `TraceGymSkyRLEnv`, a skyrl-gym ``BaseTextEnv`` (id ``trace-gym``), with snapshot/restore
``trl_rollout``        `rollout_func` for TRL's ``GRPOTrainer``: multi-turn episodes, exact tokens, env mask
``vf_env``             a verifiers taskset and harness (``vf-eval trace_gym_verifiers``), the env in the loop
=====================  ==========================================================================================

Importing this package imports none of the frameworks; each module imports its own (``pip install
'trace-gym[verifiers]'``, ``[trl]``, ``[skyrl]`` or ``[integrations]``). docs/integrations.md has an example of
each.
"""
