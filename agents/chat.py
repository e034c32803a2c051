"""Chat formatting through the tokenizer's chat template, recorded turn by turn as token ids.

A multi-turn rollout must train on exactly the ids the policy sampled. Re-rendering the whole conversation
as text and re-encoding it can tokenize an action differently than it was sampled (BPE ambiguity, a turn cut
by a stop string, a template that rewrites earlier turns). `Conversation` instead keeps one growing id list:
the rendered prompt, then each turn's sampled ids verbatim, then the template's rendering of the
observation messages that follow (computed as a text delta of the template, so any chat template works).

Observations are text, never control tokens: what a tool or a user turn says is encoded with the tokenizer's
special tokens treated as plain characters, so a tool printing ``<|im_end|>\n<|im_start|>assistant`` cannot
close its turn or open another; only the template's own markup becomes control ids. No content can make the
recording raise: the markers that split the template's text are fresh for each call.
"""

from __future__ import annotations

import copy
import secrets
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from trace_gym.errors import ConfigError


def render_prompt(tokenizer, messages: Sequence[Mapping[str, Any]],
                  tools: Sequence[Mapping[str, Any]] | None = None) -> str:
    """The chat template's text for `messages` followed by the assistant generation prompt."""
    return tokenizer.apply_chat_template(list(messages), tools=list(tools) if tools else None,
                                         tokenize=False, add_generation_prompt=True)


def encode(tokenizer, text: str) -> list[int]:
    """Ids of template-rendered text (the template already wrote any special tokens)."""
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def encode_text(tokenizer, text: str) -> list[int]:
    """Ids of text that must stay text: special tokens written in it are split like any other characters."""
    return list(tokenizer(text, add_special_tokens=False, split_special_tokens=True)["input_ids"])


def special_token_strings(tokenizer) -> set[str]:
    """Every special token's text (the named ones and added tokens marked special)."""
    found = set(getattr(tokenizer, "all_special_tokens", []) or [])
    for added in (getattr(tokenizer, "added_tokens_decoder", {}) or {}).values():
        if getattr(added, "special", False):
            found.add(str(added.content))
    return {t for t in found if t}


def _fresh_marker(texts: Iterable[str], tag: str) -> str:
    """A marker that occurs in none of ``texts`` (so no content can be mistaken for it)."""
    pool = list(texts)
    while True:
        marker = f"\ue000{tag}{secrets.token_hex(8)}\ue001"
        if not any(marker in t for t in pool):
            return marker


END_OF_TURN_TOKENS = ("<|im_end|>", "<|endoftext|>", "<|eot_id|>")
"""The end-of-turn tokens of the common chat templates (Qwen/ChatML, GPT-style, Llama 3), by their text."""


def end_of_turn_ids(tokenizer) -> set[int]:
    """Ids that end an assistant turn: the tokenizer's EOS and the model's generation-config EOS ids."""
    ids = {tokenizer.eos_token_id} if tokenizer.eos_token_id is not None else set()
    for tok in END_OF_TURN_TOKENS:
        tid = tokenizer.convert_tokens_to_ids(tok)
        if isinstance(tid, int) and tid != tokenizer.unk_token_id and tid is not None:
            ids.add(tid)
    return ids


@dataclass
class Segment:
    """A run of ids in a conversation: the prompt, one sampled turn, or one observation."""

    kind: str
    """"prompt", "action" or "observation"."""
    start: int
    end: int
    logprobs: list[float] | None = None


@dataclass
class Conversation:
    """The token-level record of one episode; `ids` is the next generation's prompt.

    Usage: `conv = Conversation.start(tok, info["messages"])`, then per turn
    `gen = policy.generate([Request(prompt_ids=conv.ids)], ...)[0]`, `conv.add_action(gen.token_ids, ...)`,
    `obs, ... = env.step(gen.text)`, `conv.add_observation(new_messages)`. `copy()` forks it for branching.
    """

    tokenizer: Any
    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] | None = None
    ids: list[int] = field(default_factory=list)
    segments: list[Segment] = field(default_factory=list)

    @classmethod
    def start(cls, tokenizer, messages: Sequence[Mapping[str, Any]],
              tools: Sequence[Mapping[str, Any]] | None = None) -> Conversation:
        msgs = [dict(m) for m in messages]
        tools_list = [dict(t) for t in tools] if tools else None
        ids = encode(tokenizer, render_prompt(tokenizer, msgs, tools_list))
        return cls(tokenizer, msgs, tools_list, ids, [Segment("prompt", 0, len(ids))])

    def copy(self) -> Conversation:
        """An independent fork (shares the tokenizer)."""
        return Conversation(self.tokenizer, copy.deepcopy(self.messages), copy.deepcopy(self.tools),
                            list(self.ids), [copy.copy(s) for s in self.segments])

    def add_action(self, token_ids: Sequence[int], text: str | None = None,
                   logprobs: Sequence[float] | None = None) -> None:
        """Append one sampled assistant turn verbatim; `text` is what the env saw (kept in `messages`)."""
        if not token_ids:
            raise ValueError("expected at least one sampled token id, got []; fix: skip empty generations")
        start = len(self.ids)
        self.ids.extend(int(t) for t in token_ids)
        self.segments.append(Segment("action", start, len(self.ids), list(logprobs) if logprobs else None))
        if text is None:
            text = self.tokenizer.decode(list(token_ids), skip_special_tokens=True)
        self.messages.append({"role": "assistant", "content": text})

    def add_observation(self, messages: Sequence[Mapping[str, Any]]) -> list[int]:
        """Append the messages after the last assistant turn (tool results, user turns; none for two
        assistant turns in a row) plus the next generation prompt, rendered by the chat template; returns the
        appended ids. Their text fields are encoded as plain text (see the module docstring)."""
        if not self.segments or self.segments[-1].kind != "action":
            raise ValueError("expected add_observation right after add_action, got two observations in a row")
        new = [dict(m) for m in messages]
        ids: list[int] = []
        for text, is_content in self._delta(new):
            ids += encode_text(self.tokenizer, text) if is_content else encode(self.tokenizer, text)
        start = len(self.ids)
        self.ids.extend(ids)
        self.segments.append(Segment("observation", start, len(self.ids)))
        self.messages.extend(new)
        return ids

    def _delta(self, new: list[dict[str, Any]]) -> list[tuple[str, bool]]:
        """Template text between the end of the last sampled turn and the next generation prompt's end, as
        pieces (text, is_content): content is what the new messages say, the rest is the template's markup.

        Rendering the history with a marker as the last assistant content splits the template's text into
        "before the turn's content" and "after it"; the after part starts with the turn's closing markup. Each
        text field of the new messages is rendered as a marker of its own too, then put back as content.
        """
        texts = [str(v) for m in [*self.messages, *new] for v in m.values() if isinstance(v, str)]
        turn = _fresh_marker(texts, "turn")
        fields: dict[str, str] = {}
        placeheld = []
        for m in new:
            held = dict(m)
            for key, value in m.items():
                if key != "role" and isinstance(value, str) and value:
                    marker = _fresh_marker([*texts, *fields], f"field{len(fields)}")
                    fields[marker] = value
                    held[key] = marker
            placeheld.append(held)
        history = [*self.messages[:-1], {"role": "assistant", "content": turn}, *placeheld]
        text = render_prompt(self.tokenizer, history, self.tools)
        if text.count(turn) != 1:
            raise ConfigError("expected the chat template to render assistant content verbatim, it did not; "
                              "fix: use a template that keeps the last assistant turn's content")
        after = text.split(turn, 1)[1]
        last = self.segments[-1]
        sampled = self.ids[last.start:last.end]
        # Drop the closing markup the model already sampled (its end-of-turn token), keep the rest.
        eot = end_of_turn_ids(self.tokenizer)
        if sampled and sampled[-1] in eot:
            closing = self.tokenizer.convert_ids_to_tokens(sampled[-1])
            if after.startswith(closing):
                after = after[len(closing):]
        pieces: list[tuple[str, bool]] = []
        while after:
            hits = [(after.find(marker), marker) for marker in fields if marker in after]
            if not hits:
                pieces.append((after, False))
                break
            at, marker = min(hits)
            if at:
                pieces.append((after[:at], False))
            pieces.append((fields[marker], True))
            after = after[at + len(marker):]
        return _merge_plain(pieces, self.tokenizer)

    def action_mask(self) -> list[bool]:
        """True on sampled (trainable) ids, False on prompt and observation ids."""
        mask = [False] * len(self.ids)
        for seg in self.segments:
            if seg.kind == "action":
                mask[seg.start:seg.end] = [True] * (seg.end - seg.start)
        return mask

    def action_logprobs(self) -> list[float | None]:
        """Behaviour logprob per id (None where not sampled or not recorded)."""
        out: list[float | None] = [None] * len(self.ids)
        for seg in self.segments:
            if seg.kind == "action" and seg.logprobs is not None:
                out[seg.start:seg.end] = seg.logprobs
        return out


def _merge_plain(pieces: list[tuple[str, bool]], tokenizer) -> list[tuple[str, bool]]:
    """One text when no special token's text touches content (the ids are then exactly the template rendering's,
    BPE merges across the seams included); the pieces, each encoded on its own, when one does."""
    joined, spans = "", []
    for text, content in pieces:
        if content:
            spans.append((len(joined), len(joined) + len(text)))
        joined += text
    for special in special_token_strings(tokenizer):
        at = joined.find(special)
        while at != -1:
            if any(at < end and start < at + len(special) for start, end in spans):
                return [p for p in pieces if p[0]]
            at = joined.find(special, at + 1)
    return [(joined, False)] if joined else []


def tokenize_episode(tokenizer, messages: Sequence[Mapping[str, Any]],
                     tools: Sequence[Mapping[str, Any]] | None = None,
                     end_turns: bool = True) -> Conversation:
    """A finished chat (system, user, assistant, tool, ..., assistant) as a `Conversation` for SFT.

    Assistant texts are encoded (they were not sampled) and, with `end_turns`, closed by the end-of-turn
    token so that the model learns to stop; everything else is rendered by the template.
    """
    msgs = [dict(m) for m in messages]
    first = next((i for i, m in enumerate(msgs) if m.get("role") == "assistant"), None)
    if first is None:
        raise ConfigError("expected at least one assistant message, got none")
    conv = Conversation.start(tokenizer, msgs[:first], tools)
    i = first
    while i < len(msgs):
        content = msgs[i].get("content") or ""
        ids = encode(tokenizer, content)
        if end_turns:
            ids.append(tokenizer.eos_token_id)
        conv.add_action(ids, text=content)
        j = i + 1
        while j < len(msgs) and msgs[j].get("role") != "assistant":
            j += 1
        if j < len(msgs) or j > i + 1:
            conv.add_observation(msgs[i + 1:j])
        i = j
    return conv
