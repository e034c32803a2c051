"""trace-gym envs in other trainers' env interfaces, and an env server any process can branch through.

=====================  ==========================================================================================
module                 what it gives
=====================  ==========================================================================================
``session``            `EnvSession`: one env played by text turns from outside, snapshots by handle (stdlib)
``env_server``         an HTTP server of sessions (reset, step, snapshot, restore, release, close) and its client
``skyrl_env``          `TraceGymSkyRLEnv`, a skyrl-gym ``BaseTextEnv`` (id ``trace-gym``), with snapshot/restore
=====================  ==========================================================================================

Adapters that play a model live with what they need: the verifiers taskset and harness with the policies
(``trace_gym.agents.vf_env``, ``vf-eval trace_gym_verifiers``), TRL's ``rollout_func`` with the trained model
and the collector (``trace_gym.training.integrations.trl_rollout``). Importing this package imports none of
the frameworks; each module imports its own (``pip install 'trace-gym[skyrl]'`` or ``[integrations]``).
docs/integrations.md has an example of each.
"""
