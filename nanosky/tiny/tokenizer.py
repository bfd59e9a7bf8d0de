"""The bundled tokenizer: a small byte-level BPE with digits split one by one, and a Qwen-style chat template.

Built from text with `build_tokenizer(texts, vocab_size)`; saved as a normal HF `tokenizer.json` so vLLM and
transformers load it like any other model's tokenizer.

Chat format (what the template renders; the agent loop relies on turns being separated by special tokens so that
tokenising a conversation turn by turn gives the same ids as rendering it whole):

    <|im_start|>system\n{system}\n# Tools\n- name(arg, ...): description\n<|im_end|>\n
    <|im_start|>user\n{content}<|im_end|>\n
    <|im_start|>assistant\n{content}<|im_end|>\n
    <|im_start|>tool\n<tool_response>{content}</tool_response><|im_end|>\n
"""

from __future__ import annotations

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

PAD, BOS_TURN, EOS_TURN = "<|endoftext|>", "<|im_start|>", "<|im_end|>"
SPECIAL_TOKENS = [PAD, BOS_TURN, EOS_TURN]
# Plain added tokens: kept when decoding (unlike special tokens), matched whole before BPE so the model sees one
# token for each tag.
TAG_TOKENS = ["<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>", "<answer>", "</answer>"]

# Tools are listed compactly (name, argument names, description) rather than as full JSON schemas: the bundled
# model has a 512-token context. Real models' own templates render their own tool format.
CHAT_TEMPLATE = (
    "{%- set nl = '\\n' -%}"
    "{%- set msgs = messages -%}"
    "{%- if msgs and msgs[0]['role'] == 'system' -%}{%- set sys = msgs[0]['content'] -%}{%- set msgs = msgs[1:] -%}"
    "{%- else -%}{%- set sys = none -%}{%- endif -%}"
    "{%- if sys is not none or tools -%}"
    "{{- '<|im_start|>system' + nl -}}"
    "{%- if sys is not none -%}{{- sys -}}{%- endif -%}"
    "{%- if tools -%}"
    "{{- nl + '# Tools' -}}"
    "{%- for t in tools -%}{%- set f = t['function'] if 'function' in t else t -%}"
    "{{- nl + '- ' + f['name'] + '(' + ((f['parameters']['properties'] | list) | join(', ')) + '): ' + f['description'] -}}"
    "{%- endfor -%}"
    '{{- nl + \'Call: <tool_call>{"name": ..., "arguments": {...}}</tool_call>\' -}}'
    "{%- endif -%}"
    "{{- '<|im_end|>' + nl -}}"
    "{%- endif -%}"
    "{%- for m in msgs -%}"
    "{{- '<|im_start|>' + m['role'] + nl -}}"
    "{%- if m['role'] == 'tool' -%}{{- '<tool_response>' + m['content'] + '</tool_response>' -}}"
    "{%- else -%}{{- m['content'] -}}{%- endif -%}"
    "{{- '<|im_end|>' + nl -}}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant' + nl -}}{%- endif -%}"
)


def build_tokenizer(texts: list[str], vocab_size: int = 1024) -> PreTrainedTokenizerFast:
    """Train a byte-level BPE on `texts`; deterministic for the same texts and vocab size."""
    tok = Tokenizer(models.BPE())
    # Digits one by one (arithmetic must see place value), then GPT-2 style byte-level splitting: every string,
    # including unseen unicode, encodes and decodes losslessly.
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    hf = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=None,
        eos_token=EOS_TURN,
        pad_token=PAD,
        unk_token=None,
        model_max_length=512,
        chat_template=CHAT_TEMPLATE,
    )
    hf.add_tokens(TAG_TOKENS)
    hf.chat_template = CHAT_TEMPLATE
    return hf
