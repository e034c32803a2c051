"""The tiny embedded model: a byte-level tokenizer with the chat/tool tags as single tokens, a Hermes/Qwen3
chat template, and a small Qwen3 model from config, saved as an ordinary model directory.

Byte-level without merges means one token per ASCII character (docs/measured.md: a character-level tokenizer
let 0.8M parameters learn the arithmetic tool task in ~2 minutes on 2 cores) while any Unicode text still
encodes losslessly. Passing a corpus trains byte-level BPE merges on it instead (digits stay single tokens).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any, Literal

from trace_gym.errors import ConfigError

Size = Literal["nano", "tiny"]

END_OF_TURN = "<|im_end|>"
PAD = "<|endoftext|>"
CONTROL_TOKENS = ("<|im_start|>", END_OF_TURN, PAD)
"""Special tokens: dropped when decoding generated text."""
TAG_TOKENS = (
    "<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>", "<python>", "</python>",
    "<answer>", "</answer>", "<search>", "</search>", "<think>", "</think>",
)
"""Single tokens that decode to their text (they are part of actions)."""

# Model shapes. head_dim is set explicitly: Qwen3Config defaults it to 128 whatever the hidden size; vLLM's CPU
# attention kernels need head_dim >= 32.
SIZES: dict[str, dict[str, Any]] = {
    "nano": dict(hidden_size=64, num_hidden_layers=4, num_attention_heads=2, num_key_value_heads=1,
                 head_dim=32, intermediate_size=192),
    "tiny": dict(hidden_size=128, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
                 head_dim=32, intermediate_size=384),
}

# Hermes tool-call format as Qwen3 renders it: tools listed in the system turn, tool results grouped into one
# user turn of <tool_response> blocks, assistant tool calls as JSON inside <tool_call> tags.
CHAT_TEMPLATE = (
    "{%- if tools %}"
    "{{- '<|im_start|>system\\n' }}"
    "{%- if messages and messages[0].role == 'system' %}{{- messages[0].content + '\\n\\n' }}{%- endif %}"
    "{{- '# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\n"
    "You are provided with function signatures within <tools></tools> XML tags:\\n<tools>' }}"
    "{%- for tool in tools %}{{- '\\n' + (tool | tojson) }}{%- endfor %}"
    "{{- '\\n</tools>\\n\\nFor each function call, return a json object with function name and arguments "
    "within <tool_call></tool_call> XML tags:\\n<tool_call>\\n{\"name\": <function-name>, \"arguments\": "
    "<args-json-object>}\\n</tool_call><|im_end|>\\n' }}"
    "{%- elif messages and messages[0].role == 'system' %}"
    "{{- '<|im_start|>system\\n' + messages[0].content + '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- for message in messages %}"
    "{%- if message.role == 'system' %}"
    "{%- if not loop.first %}{{- '<|im_start|>system\\n' + message.content + '<|im_end|>\\n' }}{%- endif %}"
    "{%- elif message.role == 'tool' %}"
    "{%- if loop.first or messages[loop.index0 - 1].role != 'tool' %}{{- '<|im_start|>user' }}{%- endif %}"
    "{{- '\\n<tool_response>\\n' + message.content + '\\n</tool_response>' }}"
    "{%- if loop.last or messages[loop.index0 + 1].role != 'tool' %}{{- '<|im_end|>\\n' }}{%- endif %}"
    "{%- elif message.role == 'assistant' %}"
    "{{- '<|im_start|>assistant\\n' + (message.content or '') }}"
    "{%- for call in message.tool_calls or [] %}"
    "{%- set fn = call.function if call.function is defined else call %}"
    "{%- if loop.first and message.content %}{{- '\\n' }}{%- endif %}"
    "{{- '<tool_call>\\n{\"name\": \"' + fn.name + '\", \"arguments\": ' }}"
    "{%- if fn.arguments is string %}{{- fn.arguments }}{%- else %}{{- fn.arguments | tojson }}{%- endif %}"
    "{{- '}\\n</tool_call>' }}"
    "{%- endfor %}"
    "{{- '<|im_end|>\\n' }}"
    "{%- else %}"
    "{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)


def build_tokenizer(corpus: Iterable[str] | None = None, vocab_size: int = 512):
    """A `PreTrainedTokenizerFast`: byte-level, tags as single tokens, Hermes chat template.

    Without a corpus the vocabulary is the 256 byte symbols (no merges); with one, byte-level BPE merges are
    trained on it up to `vocab_size` (deterministic for the same corpus).
    """
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    specials = [*CONTROL_TOKENS, *TAG_TOKENS]
    if corpus is None:
        tok = Tokenizer(models.BPE(vocab={c: i for i, c in enumerate(alphabet)}, merges=[]))
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    else:
        if vocab_size < len(alphabet) + len(specials):
            raise ConfigError(f"expected vocab_size >= {len(alphabet) + len(specials)}, got {vocab_size}")
        tok = Tokenizer(models.BPE())
        # Digits stay single tokens: merged digit groups make arithmetic copying much harder for tiny models.
        tok.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
        ])
        trainer = trainers.BpeTrainer(vocab_size=vocab_size - len(specials), initial_alphabet=alphabet,
                                      show_progress=False, special_tokens=[])
        tok.train_from_iterator(corpus, trainer=trainer)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in CONTROL_TOKENS])
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in TAG_TOKENS])
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, eos_token=END_OF_TURN, pad_token=PAD, unk_token=None, bos_token=None,
        chat_template=CHAT_TEMPLATE, model_max_length=8192, padding_side="left", clean_up_tokenization_spaces=False,
    )


def build_config(tokenizer, size: Size = "tiny"):
    """A `Qwen3Config` for one of `SIZES`, with pad separate from end-of-turn."""
    from transformers import Qwen3Config

    if size not in SIZES:
        raise ConfigError(f"expected size in {sorted(SIZES)}, got {size!r}")
    eot, pad = tokenizer.convert_tokens_to_ids([END_OF_TURN, PAD])
    return Qwen3Config(
        vocab_size=len(tokenizer), max_position_embeddings=8192, tie_word_embeddings=True,
        bos_token_id=None, eos_token_id=eot, pad_token_id=pad,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0}, **SIZES[size],
    )


def build_tiny_model(out_dir: str | Path, size: Size = "tiny", seed: int = 0,
                     corpus: Iterable[str] | None = None, vocab_size: int = 512) -> Path:
    """Build and save tokenizer + randomly initialised model + generation config to `out_dir`.

    Deterministic: the same arguments give identical files.
    """
    import torch
    from transformers import GenerationConfig, Qwen3ForCausalLM

    out = Path(out_dir)
    tokenizer = build_tokenizer(corpus, vocab_size)
    config = build_config(tokenizer, size)
    state = torch.random.get_rng_state()
    try:
        torch.manual_seed(seed)
        model = Qwen3ForCausalLM(config)
    finally:
        torch.random.set_rng_state(state)
    model.generation_config = GenerationConfig(
        eos_token_id=[config.eos_token_id, config.pad_token_id], pad_token_id=config.pad_token_id,
        do_sample=True, temperature=1.0,
    )
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    (out / "trace_gym_model.json").write_text(json.dumps({"size": size, "seed": seed,
                                                          "params": model.num_parameters()}) + "\n")
    return out
