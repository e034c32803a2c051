"""Native tool calling: the OpenAI wire form of tool calls (``tools`` in the request, ``message.tool_calls`` in
the answer, ``tool_call_id`` on results) mapped onto an env's text actions, both ways.

An env speaks text: its parser reads calls from the assistant's turn and writes them (``parser.format``). A
server with a tool-call parser (hosted APIs, ``vllm serve --enable-auto-tool-choice --tool-call-parser
hermes``) answers with structured calls instead. `ToolFormat` turns such an answer into the env's action text
(`ToolFormat.action`) and an env's chat history back into the wire form (`ToolFormat.wire_messages`): an
assistant turn this format wrote is sent back as the exact message the server gave (its call ids included),
one it did not write (an expert's, a resumed history) is parsed with the env's parser and given ids
``call_<turn>_<k>``; each tool result goes back with the id of the call it answers, in order.

As the OpenAI API defines it, an assistant message without tool calls is the final answer: its content becomes
the env's answer action (``parser.format_answer``), so a model that ends with a plain reply is scored on it. The
env's system message goes in its native form (`ToolEnv.native_system_message`): the server renders the tools'
schemas from ``tools``, and the text format's instructions (``<tools>...</tools>``, "write ``<tool_call>``") would
teach the model the wrong form.

Choices:
1. A call whose name is not a string, or a ``tool_calls`` entry that is not an object, is a server that does not
   speak the OpenAI form: `ServerError`; so is a message with neither text content nor tool calls. A call the env
   cannot run (an unknown tool, arguments that are not JSON or that the env's action format cannot write) is the
   model's mistake: it is written in the Hermes form, which the env's parser then rejects with an error
   observation, as it would the same mistake in text.
2. Text before the calls (``content`` beside ``tool_calls``) stays in front of them in the action.
3. A final answer that already reads as the env's answer (``<answer>...</answer>``, the form an env's own prompt
   may ask for) goes as written; any other is wrapped, with the markup of the env's format that it holds made
   inert (``<python>`` becomes ``&lt;python>``), so that no answer text can turn into a tool call. It ends at an
   end-of-turn token written in it (``<|im_end|>``): a server's tool-call parser keeps special tokens in the
   text (vLLM's Hermes parser does), and a model whose stop list lacks that token leaves it there.
4. A tool result without a call to answer (after an assistant turn that made none: the env answered a malformed
   turn) goes as a user message, which every server accepts.

A local model (the transformers or vLLM backend) writes its calls as text through its chat template, and the
collector keeps the exact ids it sampled. With native calls (`HFPolicy(native_tools=True)`) the prompt is the
template's own rendering of ``tools=`` under the env's native system message, and `ToolFormat.text_action` maps
the model's turn onto the env's action by the same rules as a server's answer: Hermes calls become the env's calls,
a plain reply is the final answer. A template that ignores ``tools=`` (`renders_tools` is False) gets the env's
own system message, the parser's instructions included, so the model still learns how to call.
"""

from __future__ import annotations

import dataclasses
import json
import threading
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from trace_gym.actions import ActionParser, HermesParser, load_json
from trace_gym.agents.chat import END_OF_TURN_TOKENS
from trace_gym.errors import ConfigError, ServerError
from trace_gym.tools import Tool, ToolCall

__all__ = ["ToolFormat", "renders_tools"]

_MEMORY = 65_536  # assistant turns remembered per format (server message and ids, for the next requests)


def _never(**kwargs: Any) -> str:
    raise RuntimeError("a tool of a ToolFormat is never called: the env runs its tools")


@dataclass
class ToolFormat:
    """The tools an env declares and the parser that writes its actions (`of_env` reads both from an env)."""

    tools: tuple[Tool, ...]
    parser: ActionParser
    system: tuple[str, str] | None = None
    """The env's system message and its native form: `wire_messages` sends the second in place of the first."""
    rendered: bool = True
    """Whether a local model's chat template writes the tools into its prompt (`renders_tools`; `prompt`)."""

    def __post_init__(self) -> None:
        self.tools = tuple(dataclasses.replace(t, fn=_never) for t in self.tools)  # keep no reference to the env
        self._by_name = {t.name: t for t in self.tools}
        self._sent: OrderedDict[str, dict[str, Any]] = OrderedDict()
        self._lock = threading.Lock()

    @classmethod
    def of_env(cls, env: Any) -> ToolFormat | None:
        """The format of ``env`` (any wrapper of a `ToolEnv`); None when it declares no tools."""
        base = getattr(env, "unwrapped", env)
        tool_map, parser = getattr(base, "tool_map", None), getattr(base, "parser", None)
        if not tool_map or parser is None or not callable(getattr(parser, "format", None)):
            return None
        native = getattr(base, "native_system_message", None)
        system = (base.system_message(), native()) if callable(native) else None
        return cls(tuple(tool_map.values()), parser, system)

    def schemas(self) -> list[dict[str, Any]]:
        """The ``tools`` field of a request: each tool's OpenAI function schema."""
        return [t.schema() for t in self.tools]

    # ----------------------------------------------------------------- answer -> action
    def action(self, message: Mapping[str, Any], where: str = "the response") -> str:
        """The env's action text for an assistant ``message``: its ``tool_calls`` in the env's format, else its
        ``content`` as the final answer (`answer`); remembered, so that the next request sends the message back as
        the server gave it."""
        calls = message.get("tool_calls")
        content = message.get("content")
        if not calls:
            if not isinstance(content, str):
                raise ServerError(f"expected message.content text or message.tool_calls in {where}, got neither "
                                  f"(message keys {sorted(message)}); fix: check the server's tool-call parser "
                                  "(vllm serve --enable-auto-tool-choice --tool-call-parser hermes) or use "
                                  "tool_calls='text'")
            action = self.answer(content)
            self._remember(action, {"role": "assistant", "content": content})
            return action
        if not isinstance(calls, list):
            raise ServerError(f"expected message.tool_calls to be a list in {where}, got {type(calls).__name__}; "
                              "fix: check that the server speaks the OpenAI chat-completions form")
        parsed = [_wire_call(c, k, where) for k, c in enumerate(calls)]
        texts = [self._write(name, raw) for _, name, raw in parsed]
        prefix = content if isinstance(content, str) and content.strip() else ""
        action = prefix + ("" if not prefix or prefix.endswith("\n") else "\n") + "\n".join(texts)
        self._remember(action, {"role": "assistant", "content": prefix or None,
                                "tool_calls": [{"id": cid, "type": "function",
                                                "function": {"name": name, "arguments": raw}}
                                               for cid, name, raw in parsed]})
        return action

    def answer(self, content: str) -> str:
        """The env's final-answer action for the plain reply ``content`` (choice 3)."""
        for marker in END_OF_TURN_TOKENS:
            content = content.split(marker, 1)[0]
        parsed = self.parser.parse(content, self._by_name)
        if parsed.error is None and parsed.answer is not None and not parsed.calls:
            return content
        text = content.strip()
        for name in ("answer", "tool_call", *self._by_name):
            for marker in (f"<{name}>", f"</{name}>"):
                text = text.replace(marker, "&lt;" + marker[1:])
        return self.parser.format_answer(text)

    def _remember(self, action: str, wire: dict[str, Any]) -> None:
        with self._lock:
            self._sent[action] = wire
            self._sent.move_to_end(action)
            while len(self._sent) > _MEMORY:
                self._sent.popitem(last=False)

    def _write(self, name: str, raw: str) -> str:
        """One call as the env's parser writes it; the Hermes form when it cannot (choice 1)."""
        args, _ = load_json(raw) if raw.strip() else ({}, None)  # never raises: the env answers what it cannot read
        if isinstance(args, dict):
            call = ToolCall(name, args)
            try:
                return self.parser.format(call)
            except ConfigError:
                return HermesParser().format(call)
        body = json.dumps({"name": name, "arguments": raw}, ensure_ascii=False)
        for marker in ("<tool_call>", "</tool_call>", "<answer>", "</answer>"):
            body = body.replace(marker, "\\u003c" + marker[1:])  # the same "<" inside a JSON string
        return f"<tool_call>{body}</tool_call>"

    @classmethod
    def for_policy(cls, policy: Any, env: Any, tokenizer: Any) -> ToolFormat | None:
        """The format of ``env`` for a local ``policy`` that calls tools natively (``policy.native_tools``), with
        `rendered` read from ``tokenizer``'s template; None for a policy that writes calls as text."""
        if not getattr(policy, "native_tools", False):
            return None
        fmt = cls.of_env(env)
        if fmt is not None:
            fmt.rendered = renders_tools(tokenizer, fmt.schemas())
        return fmt

    def prompt(self, messages: Sequence[Mapping[str, Any]]) -> tuple[list[dict[str, Any]], list[dict[str, Any]] | None]:
        """The messages and ``tools`` a local chat template renders for the env's first ``messages``: the native
        system message and the schemas where the template writes tools (`rendered`), else the env's messages as
        they are (the parser's instructions teach the calls)."""
        if not self.rendered:
            return [dict(m) for m in messages], None
        return self.native_messages(messages), self.schemas()

    def text_action(self, text: str) -> str:
        """The env's action for a local model's turn ``text`` in native mode: a turn the env's parser reads goes as
        written; Hermes calls (``<tool_call>{...}</tool_call>``, what chat templates teach) are rewritten in the
        env's format; a reply with no call markup at all is the final answer (`answer`); anything else (a malformed
        call) goes as written, for the env to answer with an error observation."""
        for marker in END_OF_TURN_TOKENS:
            text = text.split(marker, 1)[0]
        if self.parser.parse(text, self._by_name).error is None:
            return text
        hermes = HermesParser().parse(text, self._by_name)
        if hermes.error is None and hermes.calls:
            prefix = text[:text.find("<tool_call>")]
            calls = "\n".join(self._write(c.name, json.dumps(c.arguments, ensure_ascii=False)) for c in hermes.calls)
            return prefix + ("" if not prefix or prefix.endswith("\n") else "\n") + calls
        markup = ("<tool_call>", "</tool_call>", "<answer>", "</answer>",
                  *(f"<{name}>" for name in self._by_name), *(f"</{name}>" for name in self._by_name))
        if any(m in text for m in markup):
            return text
        return self.answer(text)

    def native_messages(self, messages: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
        """``messages`` with the env's system message in its native form (the other messages as they are)."""
        out = [dict(m) for m in messages]
        for m in out:
            if m.get("role") == "system" and self.system is not None and m.get("content") == self.system[0]:
                m["content"] = self.system[1]
        return out

    # ----------------------------------------------------------------- history -> request
    def wire_messages(self, messages: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
        """The env's chat ``messages`` in the OpenAI form: the native system message, assistant turns with their
        ``tool_calls``, each tool result with the ``tool_call_id`` of the call it answers (module docstring)."""
        out: list[dict[str, Any]] = []
        pending: list[str] = []
        turn = 0
        for m in messages:
            role, content = m.get("role"), m.get("content")
            if role == "assistant":
                wire = self._assistant(str(content or ""), turn)
                turn += 1
                pending = [c["id"] for c in wire.get("tool_calls") or []]
                out.append(wire)
            elif role == "tool" and pending:
                out.append({"role": "tool", "tool_call_id": pending.pop(0), "content": str(content or "")})
            elif role == "tool":
                out.append({"role": "user", "content": str(content or "")})
            elif role == "system" and self.system is not None and content == self.system[0]:
                pending = []
                out.append({"role": "system", "content": self.system[1]})
            else:
                pending = []
                out.append({k: v for k, v in m.items() if k in ("role", "content", "name")})
        return out

    def _assistant(self, text: str, turn: int) -> dict[str, Any]:
        with self._lock:
            sent = self._sent.get(text)
        if sent is not None:
            return json.loads(json.dumps(sent))  # a copy: the request may be changed by the caller
        parsed = self.parser.parse(text, self._by_name)
        if parsed.error is not None or not parsed.calls:
            return {"role": "assistant", "content": text}
        return {"role": "assistant", "content": None, "tool_calls": [
            {"id": f"call_{turn}_{k}", "type": "function",
             "function": {"name": c.name, "arguments": json.dumps(c.arguments, ensure_ascii=False)}}
            for k, c in enumerate(parsed.calls)]}


def _wire_call(call: Any, k: int, where: str) -> tuple[str, str, str]:
    """(id, name, arguments text) of one ``tool_calls`` entry; `ServerError` when it is not in the OpenAI form."""
    fn = call.get("function") if isinstance(call, dict) else None
    name = fn.get("name") if isinstance(fn, dict) else None
    if not isinstance(fn, dict) or not isinstance(name, str):
        raise ServerError(f"expected tool_calls[{k}] to be {{'id', 'type': 'function', 'function': {{'name', "
                          f"'arguments'}}}} in {where}, got {json.dumps(call)[:200]}; fix: check that the server "
                          "speaks the OpenAI chat-completions form")
    raw = fn.get("arguments", "")
    if not isinstance(raw, str):  # some servers send the arguments as an object
        raw = json.dumps(raw, ensure_ascii=False)
    cid = call.get("id")
    return (cid if isinstance(cid, str) and cid else f"call_{k}"), name, raw


def renders_tools(tokenizer: Any, tools: Sequence[Mapping[str, Any]]) -> bool:
    """Whether ``tokenizer``'s chat template writes ``tools`` into the prompt (a template that ignores them renders
    the same text with and without)."""
    from trace_gym.agents.chat import render_prompt

    probe = [{"role": "system", "content": "s"}, {"role": "user", "content": "u"}]
    return render_prompt(tokenizer, probe, list(tools)) != render_prompt(tokenizer, probe)
