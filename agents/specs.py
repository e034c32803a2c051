"""Policy specs: one string names any backend (for scripts now, and the commands' ``--policy SPEC`` to come).

=====================  ===========================================================================
spec                   policy
=====================  ===========================================================================
``expert``             the env's scripted expert (``env.unwrapped.expert``), noise ``options.noise``
``expert:0.3``         the same with noise 0.3
``PATH`` / ``hf:PATH`` a local model folder on transformers (``HFPolicy``); ``hf:`` also takes a hub id
``vllm:PATH``          the same folder on a vLLM engine (``VLLMPolicy``; needs the ``vllm`` extra)
``openai:MODEL``       model ``MODEL`` of an OpenAI-compatible server at ``options.base_url`` (else
                       ``$OPENAI_BASE_URL``), e.g. a ``vllm serve`` (``OpenAIPolicy``)
``openai``             the same; the model is ``options.model``, else the one model the server serves
``http(s)://HOST/v1``  that server; the model is ``options.model``, else the one model it serves
=====================  ===========================================================================

A server's tool calls are native by default (``options.tool_calls``), as the OpenAI API defines them: the env's
tool schemas go as ``tools``, the server's ``tool_calls`` become the env's action text and a reply without tool
calls is the final answer (agents/native_tools.py), which needs ``make_env``; ``"text"`` sends the messages as
the env wrote them and reads the answer's text. A server's API key is read
from the environment variable ``options.api_key_env`` (default
``OPENAI_API_KEY``; a local ``vllm serve`` needs none). A wrong spec, a folder that is not a model, a missing
key or package raise ``ConfigError`` with the fix.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import gymnasium as gym

from trace_gym.agents.policy import Policy
from trace_gym.env_specs import EnvFactory
from trace_gym.errors import ConfigError, SetupError

FORMS = "expert, expert:NOISE, a model folder, hf:PATH, vllm:PATH, openai:MODEL, openai or http(s)://HOST/v1"
Backend = Literal["expert", "hf", "vllm", "openai"]
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")


@dataclass(frozen=True)
class PolicyOptions:
    """Settings of the backends a spec can name; each backend reads its own and ignores the rest."""

    noise: float = 0.0
    """expert: chance of a wrong step (``expert:NOISE`` overrides it)."""
    device: str = "auto"
    """hf: "auto" (cuda when available), "cpu" or "cuda[:i]"."""
    dtype: str = "auto"
    """hf, vllm: weight dtype ("auto", "float32", "bfloat16", ...)."""
    max_batch_size: int = 64
    """hf: rows per forward."""
    max_model_len: int = 4096
    """vllm: context length of the engine."""
    seed: int = 0
    """vllm: engine seed (sampling seeds come with each request)."""
    base_url: str | None = None
    """openai: the server's base URL ending in /v1 (default: $OPENAI_BASE_URL)."""
    model: str | None = None
    """openai: the served model name, for a URL spec (default: the server's only model)."""
    api_key_env: str = "OPENAI_API_KEY"
    """openai: the environment variable holding the API key (unset: no key is sent)."""
    tokenizer: str | None = None
    """openai: a local tokenizer folder; prompts are then rendered here and sent as token ids (exact ids
    and logprobs for training), else the server renders chat messages."""
    server: Literal["auto", "vllm", "openai"] = "auto"
    """openai: "vllm" asks for vLLM's extra fields (token ids, top_k); "openai" sends the standard ones only;
    "auto" asks the server (vLLM's ``GET /models`` says ``owned_by: vllm``)."""
    tool_calls: Literal["native", "text"] | None = None
    """openai, hf, vllm: None is the backend's default, "native" for a server and "text" for a model folder. openai:
    "native" sends the env's tools and reads the answer's tool_calls, a reply without them being the
    final answer (a server with a tool-call parser, any hosted API); "text" lets the model write calls as text for
    the env to parse."""
    concurrency: int = 16
    """openai: most requests in flight at once (over all threads using the policy)."""
    max_retries: int = 5
    """openai: retries of a failed request (connection errors, timeouts, 408/429/5xx)."""
    timeout: float = 120.0
    """openai: seconds per request."""
    extra_body: Mapping[str, Any] | None = None
    """openai: fields added to every request as given, e.g. ``{"reasoning_effort": "low"}``."""


def policy_from_spec(spec: str, options: PolicyOptions | None = None,
                     make_env: Callable[[], gym.Env] | None = None) -> Policy:
    """The `Policy` that ``spec`` names (module docstring). ``make_env`` is needed by ``expert`` only: the
    expert is the env factory's (`trace_gym.env_specs.EnvFactory.expert`), re-seeded per request
    (``ExpertPolicy``)."""
    options = options or PolicyOptions()
    backend = backend_of(spec)
    kind, _, rest = spec.partition(":")
    if backend == "openai" and spec.startswith(("http://", "https://")):
        return _openai(options.model, spec, options, make_env)
    if backend == "openai":
        if rest and options.model and rest != options.model:
            raise ConfigError(f"expected one model name, got {spec!r} and options.model={options.model!r}; fix: "
                              "name the model once (openai:NAME, or openai with the model option)")
        return _openai(rest or options.model, options.base_url or os.environ.get("OPENAI_BASE_URL"), options,
                       make_env)
    if backend == "expert":
        return _expert(spec, rest, options, make_env)
    if backend == "vllm":
        return _vllm(rest, options)
    return _hf(rest, options, hub=True) if kind == "hf" else _hf(spec, options, hub=False)


def backend_of(spec: str) -> Backend:
    """Which backend ``spec`` names ("expert", "hf", "vllm" or "openai"), from its form alone (nothing is loaded
    or contacted); a string of no form, and not an existing path, raises ``ConfigError``."""
    if not isinstance(spec, str) or not spec.strip():
        raise ConfigError(f"expected a policy spec ({FORMS}), got {spec!r}; fix: e.g. expert or models/tiny")
    kind = spec.partition(":")[0]
    if spec.startswith(("http://", "https://")) or kind == "openai":
        return "openai"
    if kind in ("expert", "vllm", "hf"):
        return kind  # type: ignore[return-value]
    if Path(spec).exists():
        return "hf"
    for prefix in ("openai", "vllm", "hf", "expert"):
        if spec.startswith(prefix + "/"):  # LiteLLM's provider/model form
            raise ConfigError(f"expected a policy spec ({FORMS}), got {spec!r} (no such folder either); fix: did "
                              f"you mean {prefix}:{spec[len(prefix) + 1:]}?")
    raise ConfigError(f"expected a policy spec ({FORMS}), got {spec!r} (no such folder either); fix: "
                      "trace-gym model init --out models/tiny builds a model folder; the scripted expert is 'expert'")


def parse_extra_body(text: str) -> dict[str, Any]:
    """The JSON object of ``--extra-body`` (`PolicyOptions.extra_body`), else a ``ConfigError``."""
    import json

    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        value = exc
    if not isinstance(value, dict):
        got = f"invalid JSON ({value})" if isinstance(value, json.JSONDecodeError) else type(value).__name__
        raise ConfigError(f"expected --extra-body to be a JSON object, got {got}; fix: e.g. --extra-body "
                          "'{\"reasoning_effort\": \"low\"}' (quote it for the shell)")
    return value


def check_model_folder(path: str | Path) -> Path:
    """``path`` when it is a local model folder (config.json and tokenizer files, as ``save_pretrained`` writes
    them), else a ``ConfigError`` that says what is missing."""
    p = Path(path)
    fix = "fix: pass a folder written by save_pretrained (a Hugging Face model), or build the tiny model: " \
        f"trace-gym model init --out {path}"
    gguf = [p] if p.suffix == ".gguf" and p.is_file() else sorted(p.glob("*.gguf")) if p.is_dir() else []
    if gguf and not (p / "config.json").is_file():
        raise ConfigError(f"expected a model folder, got a GGUF file ({gguf[0].name}), which transformers cannot "
                          f"train; fix: trace-gym model fetch {gguf[0]} --out models/{gguf[0].stem} converts it")
    if not p.is_dir():
        raise ConfigError(f"expected a model folder, got {str(path)!r} (no such folder); {fix}")
    if not (p / "config.json").is_file():
        raise ConfigError(f"expected a model folder with config.json, got {str(path)!r} (none there); {fix}")
    if not any((p / f).is_file() for f in TOKENIZER_FILES):
        raise ConfigError(f"expected a model folder with tokenizer files ({', '.join(TOKENIZER_FILES)}), got "
                          f"{str(path)!r} (none there); {fix}")
    return p


def _expert(spec: str, rest: str, options: PolicyOptions, make_env: Callable[[], gym.Env] | None) -> Policy:
    from trace_gym.agents.scripted import ExpertPolicy

    noise = options.noise
    if rest:
        try:
            noise = float(rest)
        except ValueError:
            noise = -1.0
    if not 0.0 <= noise <= 1.0:
        raise ConfigError(f"expected expert noise in [0, 1], got {spec!r}; fix: e.g. expert:0.3")
    if make_env is None:
        raise ConfigError("expected an env for the scripted expert, got none; fix: policy_from_spec('expert', "
                          "make_env=trace_gym.env_specs.env_factory(ENV_ID))")
    factory = EnvFactory.of(make_env)
    if not factory.has_expert:
        with factory.reading() as env:
            name = type(env.unwrapped).__name__
        raise ConfigError(f"expected an env with a scripted expert (env.expert(noise, seed)), got {name} without "
                          "one; fix: use a model policy")
    return ExpertPolicy(lambda seed: factory.expert(noise=noise, seed=seed))


def _hf(path: str, options: PolicyOptions, hub: bool) -> Policy:
    if not path:
        raise ConfigError("expected hf:PATH, got 'hf:'; fix: e.g. hf:models/tiny")
    if not hub or Path(path).exists():
        check_model_folder(path)
    import torch

    from trace_gym.agents.hf import HFPolicy

    device = options.device
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    try:
        return HFPolicy.from_pretrained(path, device=device, dtype=options.dtype,
                                        max_batch_size=options.max_batch_size,
                                        native_tools=options.tool_calls == "native")
    except OSError as exc:  # transformers' "not a local folder and not a valid model identifier", offline hub
        raise ConfigError(f"expected a model folder or hub id in hf:{path}, got {_first_line(exc)}; fix: pass a "
                          "local folder written by save_pretrained") from None


def _vllm(path: str, options: PolicyOptions) -> Policy:
    if not path:
        raise ConfigError("expected vllm:PATH, got 'vllm:'; fix: e.g. vllm:models/tiny")
    check_model_folder(path)
    try:
        import vllm  # noqa: F401 - the engine itself is imported lazily by VLLMPolicy

        from trace_gym.agents.vllm import VLLMPolicy
    except ImportError as exc:
        raise SetupError(f"expected the vllm package for vllm:{path}, got ImportError: {exc}; fix: "
                         "pip install -e '.[vllm]' (on a GPU machine) or use the model folder with transformers"
                         ) from None
    policy = VLLMPolicy.from_pretrained(path, dtype=options.dtype, max_model_len=options.max_model_len,
                                        seed=options.seed)
    policy.native_tools = options.tool_calls == "native"
    return policy


def _openai(model: str | None, base_url: str | None, options: PolicyOptions,
            make_env: Callable[[], gym.Env] | None = None) -> Policy:
    from trace_gym.agents.native_tools import ToolFormat
    from trace_gym.agents.openai_backend import OpenAIPolicy

    if not base_url:
        raise ConfigError("expected the server's base URL, got none; fix: --base-url URL (the base_url option) or "
                          "export OPENAI_BASE_URL=URL, e.g. http://127.0.0.1:8000/v1")
    api_key = os.environ.get(options.api_key_env) or None
    if options.api_key_env != "OPENAI_API_KEY" and api_key is None:
        raise ConfigError(f"expected the API key in ${options.api_key_env}, got the variable unset or empty; "
                          f"fix: export {options.api_key_env}=...")
    tokenizer = None
    if options.tokenizer is not None:
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(check_model_folder(options.tokenizer)
                                                  if Path(options.tokenizer).exists() else options.tokenizer)
    if options.tool_calls not in ("native", "text", None):
        raise ConfigError(f"expected tool_calls 'native' or 'text', got {options.tool_calls!r}")
    tool_format = None
    if options.tool_calls != "text" and tokenizer is None and make_env is not None:
        with EnvFactory.of(make_env).reading() as env:  # the format keeps no reference to the env
            tool_format = ToolFormat.of_env(env)
    policy = OpenAIPolicy(base_url, model or "", tokenizer=tokenizer, api_key=api_key, server=options.server,
                          timeout=options.timeout, max_retries=options.max_retries, concurrency=options.concurrency,
                          tool_calls=options.tool_calls or "native", tool_format=tool_format,
                          extra_body=dict(options.extra_body) if options.extra_body is not None else None)
    if not model:
        served = policy.models()
        if len(served) != 1:
            raise ConfigError(f"expected a model name for {base_url} (it serves {', '.join(served) or 'none'}), "
                              f"got none; fix: --model NAME (the model option) or the spec openai:NAME")
        policy.model = served[0]
    return policy


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"
