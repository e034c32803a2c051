"""trace-gym envs in other trainers' env interfaces, and an env server (OpenEnv's protocol) any process can
branch through.

=====================  ==========================================================================================
module                 what it gives
=====================  ==========================================================================================
``session``            `EnvSession`: one env played by text turns from outside, snapshots by handle (stdlib)
``env_server``         one env on OpenEnv's protocol, with snapshot, restore and branch (``trace-gym serve``)
``serve_guard``        what a request must be (Host, Origin, token, JSON, length) and the connection bounds
``serve_sessions``     the server's sessions: unguessable ids, owners, the idle timeout
``serve_budget``       the server-wide budget of live sessions and snapshots, derived from the host
``serve_payloads``     the request and answer bodies (OpenEnv's shapes)
``env_client``         `EnvClient`, the server's Python client (httpx)
``skyrl_env``          `TraceGymSkyRLEnv`, a skyrl-gym ``BaseTextEnv`` (id ``trace-gym``), with snapshot/restore
=====================  ==========================================================================================

Adapters that play a model live with what they need: the verifiers taskset and harness with the policies
(``trace_gym.agents.vf_env``, ``vf-eval trace_gym_verifiers``), TRL's ``rollout_func`` with the trained model
and the collector (``trace_gym.training.integrations.trl_rollout``). Importing this package imports none of
the frameworks; each module imports its own (from a checkout: ``pip install -e '.[skyrl]'``,
``'.[integrations]'`` or ``'.[serve]'``). docs/integrations.md has an example of each.
"""
