"""The tiny embedded model: deterministic build, lossless tokenizer with single-token tags, Hermes template."""

from __future__ import annotations

import hashlib

from hypothesis import given, settings
from hypothesis import strategies as st
from transformers import AutoModelForCausalLM, AutoTokenizer

from trace_gym.agents.tiny import CONTROL_TOKENS, TAG_TOKENS, build_tiny_model, build_tokenizer

TOK = build_tokenizer()


def _digest(path):
    return hashlib.sha256((path / "model.safetensors").read_bytes()).hexdigest()


def test_same_seed_builds_identical_weights_and_another_seed_differs(tmp_path, nano_dir):
    again = build_tiny_model(tmp_path / "a", size="nano", seed=0)
    other = build_tiny_model(tmp_path / "b", size="nano", seed=1)
    assert _digest(again) == _digest(nano_dir) != _digest(other)


def test_model_folder_loads_with_auto_classes_and_has_the_intended_size(nano_dir, tmp_path):
    nano = AutoModelForCausalLM.from_pretrained(nano_dir)
    tiny = AutoModelForCausalLM.from_pretrained(build_tiny_model(tmp_path / "t", size="tiny"))
    tok = AutoTokenizer.from_pretrained(nano_dir)
    assert 0.15e6 < nano.num_parameters() < 0.3e6 and 0.6e6 < tiny.num_parameters() < 1.0e6
    assert tok.pad_token_id != tok.eos_token_id == nano.config.eos_token_id
    assert tiny.config.tie_word_embeddings and tiny.config.head_dim == 32


@settings(max_examples=60, deadline=None)
@given(st.text(st.characters(blacklist_categories=("Cs",)), max_size=80))
def test_any_text_round_trips(text):
    assert TOK.decode(TOK(text, add_special_tokens=False)["input_ids"]) == text


def test_tags_and_control_tokens_are_single_tokens():
    for tag in (*CONTROL_TOKENS, *TAG_TOKENS):
        assert len(TOK(tag, add_special_tokens=False)["input_ids"]) == 1, tag


def test_ascii_is_one_token_per_character():
    text = "print(12 * 7 - 3)\n"
    assert len(TOK(text, add_special_tokens=False)["input_ids"]) == len(text)


def test_tags_survive_decoding_but_control_tokens_do_not():
    ids = TOK("<python>1</python><|im_end|>", add_special_tokens=False)["input_ids"]
    assert TOK.decode(ids, skip_special_tokens=True) == "<python>1</python>"


def test_template_renders_hermes_tool_calls_and_tool_responses():
    tools = [{"type": "function", "function": {"name": "search", "description": "d", "parameters": {}}}]
    msgs = [{"role": "user", "content": "q"},
            {"role": "assistant", "content": "", "tool_calls": [
                {"type": "function", "function": {"name": "search", "arguments": {"query": "x"}}}]},
            {"role": "tool", "content": "r1"}, {"role": "tool", "content": "r2"}]
    text = TOK.apply_chat_template(msgs, tools=tools, tokenize=False, add_generation_prompt=True)
    assert '<tools>\n{"type": "function"' in text
    assert '<|im_start|>assistant\n<tool_call>\n{"name": "search", "arguments": {"query": "x"}}\n</tool_call>' \
           '<|im_end|>\n' in text
    assert text.endswith("<|im_start|>user\n<tool_response>\nr1\n</tool_response>\n<tool_response>\nr2\n"
                         "</tool_response><|im_end|>\n<|im_start|>assistant\n")


def test_corpus_trained_bpe_keeps_digits_single_and_round_trips():
    corpus = ["the answer is 12345 and the answer is 678"] * 50
    tok = build_tokenizer(corpus, vocab_size=300)
    ids = tok("the answer is 905", add_special_tokens=False)["input_ids"]
    assert len(ids) < len("the answer is 905") and tok.decode(ids) == "the answer is 905"
    assert [tok.decode([i]) for i in ids[-3:]] == ["9", "0", "5"]
