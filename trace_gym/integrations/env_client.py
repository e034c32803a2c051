"""`EnvClient`: the Python client of an env server (`trace_gym.integrations.env_server`) over HTTP, on httpx.
``client.open()`` is a `RemoteEnv`, used like the env (``reset``, ``step`` as gymnasium's 5-tuple) plus the
server's branching: ``snapshot``, ``restore``, ``branch`` (a second session from the same turn), ``release``.

OpenEnv's own clients (``GenericEnvClient``, over the WebSocket ``/ws``) play the same server unchanged.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from trace_gym.errors import ConfigError, ServerError, SetupError

try:
    import httpx
except ImportError:
    raise SetupError("expected httpx (the env client's HTTP library), got none; fix: pip install "
                      "-e . (from the checkout; httpx is a base requirement)") from None

__all__ = ["EnvClient", "RemoteEnv"]

SESSION_HEADER = "X-Session-Id"


class EnvClient:
    """A client of the env server at ``url``; ``token``: the credential it asks for (none on loopback). A refused
    request raises `ServerError` with the server's message."""

    def __init__(self, url: str, token: str | None = None, timeout: float = 300.0):
        self.url = url.rstrip("/")
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self.http = httpx.Client(base_url=self.url, headers=headers, timeout=timeout, trust_env=False)

    def open(self) -> RemoteEnv:
        """A `RemoteEnv`; its session opens at the first ``reset``."""
        return RemoteEnv(self)

    def health(self) -> dict[str, Any]:
        return self.request("GET", "/health")[0]

    def metadata(self) -> dict[str, Any]:
        return self.request("GET", "/metadata")[0]

    def request(self, method: str, path: str, body: Mapping[str, Any] | None = None, session: str | None = None
                ) -> tuple[dict[str, Any], httpx.Headers]:
        """The answer's JSON and headers; ``session`` goes in the ``X-Session-Id`` header."""
        headers = {SESSION_HEADER: session} if session else {}
        try:
            resp = self.http.request(method, path, json=dict(body or {}) if method != "GET" else None,
                                     headers=headers)
        except httpx.HTTPError as exc:
            raise ServerError(f"expected the env server at {self.url}, got {type(exc).__name__}: {exc}; fix: start "
                              "it: trace-gym serve --env ENV --port PORT") from None
        if resp.status_code >= 400:
            try:
                detail = resp.json().get("detail", resp.text)
            except ValueError:
                detail = resp.text
            raise ServerError(f"expected an answer from the env server at {self.url}, got HTTP {resp.status_code} "
                              f"for {method} {path}: {detail}")
        return resp.json(), resp.headers

    def close(self) -> None:
        self.http.close()

    def __enter__(self) -> EnvClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class RemoteEnv:
    """One session of an env server. ``reset`` returns ``(text, out)`` and ``step`` gymnasium's 5-tuple
    ``(text, reward, terminated, truncated, out)``; ``out`` is the answer's observation (``messages``: what the
    env added; ``info``; ``task_id``) with its ``reward`` and ``done``."""

    def __init__(self, client: EnvClient, session: str | None = None):
        self.client, self.session = client, session
        self.tools: list[dict[str, Any]] = []

    def reset(self, task_id: str | None = None, index: int | None = None, seed: int | None = None
              ) -> tuple[str, dict[str, Any]]:
        body = {k: v for k, v in (("task_id", task_id), ("index", index), ("seed", seed)) if v is not None}
        out, headers = self.client.request("POST", "/reset", body, self.session)
        self.session = headers[SESSION_HEADER]
        obs = self._flat(out)
        self.tools = obs["tools"]
        return obs["text"], obs

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        obs = self._flat(self._post("/step", {"action": {"message": action}}))
        return obs["text"], float(obs["reward"] or 0.0), obs["terminated"], obs["truncated"], obs

    def snapshot(self) -> str:
        return self._post("/snapshot", {})["snapshot"]

    def restore(self, handle: str) -> tuple[str, dict[str, Any]]:
        obs = self._flat(self._post("/restore", {"snapshot": handle}))
        return obs["text"], obs

    def branch(self, handle: str) -> RemoteEnv:
        """A new session of the server restored to ``handle`` (a snapshot taken here), independent of this one."""
        out, headers = self.client.request("POST", "/branch", {"snapshot": handle}, self._session())
        branch = RemoteEnv(self.client, headers[SESSION_HEADER])
        branch.tools = out["observation"]["tools"]
        return branch

    def release(self, handle: str) -> None:
        self._post("/release", {"snapshot": handle})

    def state(self) -> dict[str, Any]:
        return self.client.request("GET", "/state", session=self._session())[0]

    def messages(self) -> list[dict[str, Any]]:
        """The whole chat of the episode so far."""
        return self.state()["messages"]

    def close(self) -> None:
        if self.session is not None:
            self._post("/close", {})
            self.session = None

    def _session(self) -> str:
        if self.session is None:
            raise ConfigError("expected a session, got none yet; fix: call reset() first")
        return self.session

    def _post(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        return self.client.request("POST", path, body, self._session())[0]

    @staticmethod
    def _flat(out: dict[str, Any]) -> dict[str, Any]:
        return {**out["observation"], "reward": out["reward"], "done": out["done"]}
