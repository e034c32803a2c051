"""Native tool calls of a local model (`HFPolicy(native_tools=True)`): the prompt is the chat template's own
rendering of the env's tools, the model's Hermes calls become the env's calls, a plain reply is the final answer
(the rule a server's answer follows), and the token record stays the ids the model saw and sampled."""

from __future__ import annotations

import pytest
import torch

from trace_gym.agents.chat import render_prompt
from trace_gym.agents.hf import HFPolicy, sequence_logprobs
from trace_gym.agents.native_tools import ToolFormat, renders_tools
from trace_gym.agents.policy import SamplingParams
from trace_gym.env_specs import env_factory
from trace_gym.training.rollout.collector import context_ids
from trace_gym.training.rollout.evaluate import evaluate_policy

# SmolLM2-Instruct's ChatML template: it ignores tools=
CHATML = ("{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + "
          "'<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")
MAKE_ENV = env_factory("trace/Arithmetic-v0", {"n_tasks": 6, "max_turns": 3})


@pytest.fixture(scope="module")
def arithmetic_format():
    with MAKE_ENV() as env:
        env.reset(seed=0)
        return ToolFormat.of_env(env), env.unwrapped.system_message(), env.unwrapped.native_system_message()


def test_a_hermes_call_becomes_the_envs_call_and_a_plain_reply_its_answer(arithmetic_format):
    fmt, _, _ = arithmetic_format
    call = '<tool_call>{"name": "python", "arguments": {"code": "print(6*7)"}}</tool_call>'
    assert fmt.text_action(call) == "<python>print(6*7)</python>"
    assert fmt.text_action("Let me compute.\n" + call) == "Let me compute.\n<python>print(6*7)</python>"
    assert fmt.text_action("The answer is 42.<|im_end|>") == "<answer>The answer is 42.</answer>"
    assert fmt.text_action("<python>print(1)</python>") == "<python>print(1)</python>"  # the env's own form
    assert fmt.text_action("<answer>42</answer>") == "<answer>42</answer>"
    # a malformed call is the model's mistake: the env answers it, it never becomes an answer
    assert fmt.text_action('<tool_call>{"name": "python"') == '<tool_call>{"name": "python"'


def test_the_template_decides_whether_the_tools_are_rendered(nano_policy, arithmetic_format):
    fmt, text_system, native_system = arithmetic_format
    tok = nano_policy.tokenizer
    assert renders_tools(tok, fmt.schemas())
    messages = [{"role": "system", "content": text_system}, {"role": "user", "content": "2+2"}]
    fmt.rendered = True
    native_msgs, tools = fmt.prompt(messages)
    assert native_msgs[0]["content"] == native_system and tools == fmt.schemas()
    assert '"name": "python"' in render_prompt(tok, native_msgs, tools)
    saved = tok.chat_template
    try:
        tok.chat_template = CHATML
        assert not renders_tools(tok, fmt.schemas())
    finally:
        tok.chat_template = saved
    fmt.rendered = False
    assert fmt.prompt(messages) == (messages, None)  # the parser's instructions teach the calls instead


def test_native_episodes_offer_the_tools_and_take_plain_replies_as_answers(nano_dir):
    sampling = SamplingParams(temperature=1.0, max_new_tokens=12, seed=0)
    results = {}
    for native in (False, True):
        policy = HFPolicy.from_pretrained(nano_dir, native_tools=native)
        results[native] = evaluate_policy(policy, MAKE_ENV, 6, samples=2, sampling=sampling, keep_trees=True,
                                          workers=2)
    text_trees, native_trees = results[False].trees, results[True].trees
    prompt = policy.tokenizer.decode(native_trees[0].root.prompt_ids)
    assert "<tools>" in prompt and "reply with it alone" in prompt  # rendered schemas, native system message
    assert "<tools>" not in policy.tokenizer.decode(text_trees[0].root.prompt_ids)
    fmt = ToolFormat.of_env(MAKE_ENV())
    plain = [n for t in native_trees for n in t.nodes[1:]
             if n.token_ids and fmt.text_action(policy.tokenizer.decode(n.token_ids)).startswith("<answer>")
             and "<" not in policy.tokenizer.decode(n.token_ids, skip_special_tokens=True)]
    assert plain and all(n.is_terminal and n.info.get("stop_reason") == "answer" for n in plain)
    # the text form reads the same kind of reply as a format error: the rule differs, the model does not
    assert any("error" in n.info for t in text_trees for n in t.nodes[1:])
    # the record is what the model saw and sampled: recomputed logprobs match the sampled ones
    for tree in native_trees:
        for node in tree.nodes[1:]:
            ids = context_ids(tree, node.id) + list(node.token_ids)
            with torch.no_grad():
                ref = sequence_logprobs(policy.model, torch.tensor([ids]))[0, -len(node.token_ids):]
            torch.testing.assert_close(ref, torch.tensor(node.logprobs), atol=1e-4, rtol=0)
