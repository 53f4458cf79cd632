"""Tokenizer families: special tokens, chat templates and pinned ids for each model family the tests use.

Chat templates are read at build time from the installed ``trl`` package (``trl/chat_templates/*.jinja``), which
ships the exact templates of the hub models; TRL matches templates by text to choose its tool-call parser, so the
stand-ins must carry the same text. Families whose template TRL does not ship get a short template of our own.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from importlib import resources

from benchmarks.trl_tests.standins.toktools import build_tokenizer, check_encodings, wrap


def trl_template(name: str) -> str:
    return resources.files("trl").joinpath("chat_templates", f"{name}.jinja").read_text(encoding="utf-8")


# Tokens that the hub tokenizers mark as *not* special: they must survive ``skip_special_tokens=True`` decoding,
# because TRL parses tool calls and reasoning from decoded text.
_NOT_SPECIAL_MARKERS = ("tool_call", "tool_response", "think", "fim_", "repo_name", "file_sep", "arg_key", "arg_value")


def _specials(first_id: int, names: list[str]) -> list[tuple[int, str, bool]]:
    out = []
    for i, name in enumerate(names):
        special = not any(m in name for m in _NOT_SPECIAL_MARKERS)
        out.append((first_id + i, name, special))
    return out


# ----------------------------------------------------------------------------------------------------------------
# Qwen2 / Qwen2.5 / Qwen3 vocabulary (151,643 ordinary tokens). The pinned ids below are the ones TRL's GRPO tests
# write as literal integers in their fake `generate` outputs; each maps to the text it has in the real vocabulary.
QWEN_PINNED = {
    4913: '{"', 606: "name", 788: '":', 330: ' "', 64648: "multiply", 22785: "_tool", 497: '",',
    16370: "arguments", 5212: ' {"', 11248: "}}\n", 1513: " don", 944: "'t", 1414: " know", 894: " any",
    5392: " tool", 7692: "async", 93054: "_multiply", 17453: "Done", 35744: "increment", 9520: "step",
    2765: " won", 927: "sh", 411: "out", 1318: "text", 6023: "hi", 95642: '"}}\n', 450: "de", 13477: "crement",
    16252: " increment", 14172: "tool", 6659: "call", 397: ">\n", 522: "</", 314: " {", 293: " b",
}  # fmt: skip

QWEN_SPECIAL_NAMES = [
    "<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|object_ref_start|>", "<|object_ref_end|>", "<|box_start|>",
    "<|box_end|>", "<|quad_start|>", "<|quad_end|>", "<|vision_start|>", "<|vision_end|>", "<|vision_pad|>",
    "<|image_pad|>", "<|video_pad|>", "<tool_call>", "</tool_call>", "<|fim_prefix|>", "<|fim_middle|>",
    "<|fim_suffix|>", "<|fim_pad|>", "<|repo_name|>", "<|file_sep|>",
]  # fmt: skip
QWEN3_EXTRA = ["<tool_response>", "</tool_response>", "<think>", "</think>"]

# Qwen3.5 / Qwen3.6 vocabulary (248,044 ordinary tokens), same special-token order shifted.
QWEN35_PINNED = {
    1628: "function", 13744: "=screen", 30091: "shot", 22076: "_tool", 510: "</", 1459: " don", 914: "'t",
    1366: " know", 866: " any", 5224: " tool", 16936: "Done",
}  # fmt: skip

# Strings whose ids are written out in TRL's tests; checked after building (a mismatch is reported, not fatal).
QWEN_CHECKS = {
    '<tool_call>\n{"name": "multiply_tool", "arguments": {"a": 3, "b": 4}}\n</tool_call><|im_end|>': [151657, 198, 4913, 606, 788, 330, 64648, 22785, 497, 330, 16370, 788, 5212, 64, 788, 220, 18, 11, 330, 65, 788, 220, 19, 11248, 151658, 151645],
    '<tool_call>\n{"name": "async_multiply_tool", "arguments": {"a": 3, "c": 4}}\n</tool_call><|im_end|>': [151657, 198, 4913, 606, 788, 330, 7692, 93054, 22785, 497, 330, 16370, 788, 5212, 64, 788, 220, 18, 11, 330, 66, 788, 220, 19, 11248, 151658, 151645],
    "I don't know any tool<|im_end|>": [40, 1513, 944, 1414, 894, 5392, 151645],
    "Done!<|im_end|>": [17453, 0, 151645],
    '<tool_call>\n{"name": "shout", "arguments": {"text": "hi"}}\n</tool_call><|im_end|>': [151657, 198, 4913, 606, 788, 330, 927, 411, 497, 330, 16370, 788, 5212, 1318, 788, 330, 6023, 95642, 151658, 151645],
    '<tool_call>\n{"name": "decrement", "arguments": {"step": 2}}\n</tool_call><|im_end|>': [151657, 198, 4913, 606, 788, 330, 450, 13477, 497, 330, 16370, 788, 5212, 9520, 788, 220, 17, 11248, 151658, 151645],
    "I won't increment<|im_end|>": [40, 2765, 944, 16252, 151645],
    '<toolcall>\n{"arguments": {"a": 3, "b": 4}}\n</toolcall><|im_end|>': [27, 14172, 6659, 397, 4913, 16370, 788, 5212, 64, 788, 220, 18, 11, 330, 65, 788, 220, 19, 11248, 522, 14172, 6659, 29, 151645],
    '<tool_call>\n{"arguments": {a: 3, b: 4}}\n</tool_call><|im_end|>': [151657, 198, 4913, 16370, 788, 314, 64, 25, 220, 18, 11, 293, 25, 220, 19, 11248, 151658, 151645],
}  # fmt: skip
QWEN35_CHECKS = {
    "<tool_call>\n<function=screenshot_tool>\n</function>\n</tool_call><|im_end|>": [248058, 198, 27, 1628, 13744, 30091, 22076, 29, 198, 510, 1628, 29, 198, 248059, 248046],
    "I don't know any tool<|im_end|>": [40, 1459, 914, 1366, 866, 5224, 248046],
    "Done!<|im_end|>": [16936, 0, 248046],
}  # fmt: skip

MISTRAL_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}"
    "{% if message['role'] == 'user' %}{{ '[INST] ' + message['content'] + ' [/INST]' }}"
    "{% elif message['role'] == 'assistant' %}{{ message['content'] + eos_token }}{% endif %}"
    "{% endfor %}"
)
LLAVA_TEMPLATE = (
    "{% for message in messages %}{{ message['role'].upper() + ': ' }}"
    "{% if message['content'] is string %}{{ message['content'] }}{% else %}"
    "{% for part in message['content'] %}{% if part['type'] == 'image' %}{{ '<image>\n' }}"
    "{% elif part['type'] == 'text' %}{{ part['text'] }}{% endif %}{% endfor %}{% endif %}"
    "{{ '\n' }}{% endfor %}{% if add_generation_prompt %}{{ 'ASSISTANT:' }}{% endif %}"
)


@dataclass
class Family:
    n_regular: int
    special_names: list[str]
    template: str | None
    eos: str
    pad: str | None = None
    bos: str | None = None
    unk: str | None = None
    add_bos: bool = False
    pinned: dict[int, str] = field(default_factory=dict)
    checks: dict[str, list[int]] = field(default_factory=dict)
    vocab_size: int | None = None  # model embedding rows (>= tokenizer length)
    extra: dict = field(default_factory=dict)  # extra tokenizer attributes (e.g. image_token)

    def build(self):
        specials = _specials(self.n_regular, self.special_names)
        tok = build_tokenizer(
            n_regular=self.n_regular, specials=specials, pinned=self.pinned, bos=self.bos, add_bos=self.add_bos
        )
        template = self.template
        if template is not None and template.startswith("trl:"):
            template = trl_template(template[4:])
        fast = wrap(
            tok,
            chat_template=template,
            eos_token=self.eos,
            pad_token=self.pad,
            bos_token=self.bos,
            unk_token=self.unk,
            **self.extra,
        )
        problems = check_encodings(fast, self.checks)
        return fast, problems

    def model_vocab_size(self) -> int:
        n = self.n_regular + len(self.special_names)
        return max(self.vocab_size or 0, n)

    def token_id(self, text: str) -> int:
        if text in self.special_names:
            return self.n_regular + self.special_names.index(text)
        raise KeyError(text)


SMALL = 2048  # ordinary-vocabulary size for families whose ids no test writes out

FAMILIES: dict[str, Family] = {
    "qwen2_5": Family(151643, QWEN_SPECIAL_NAMES, "trl:qwen2_5", eos="<|im_end|>", pad="<|endoftext|>",
                      pinned=QWEN_PINNED, checks=QWEN_CHECKS, vocab_size=151936),
    "qwen2_5_vl": Family(151643, QWEN_SPECIAL_NAMES, "trl:qwen2_5_vl", eos="<|im_end|>", pad="<|endoftext|>",
                         pinned=QWEN_PINNED, vocab_size=151936,
                         extra={"extra_special_tokens": {"image_token": "<|image_pad|>", "video_token": "<|video_pad|>",
                                                         "vision_bos_token": "<|vision_start|>",
                                                         "vision_eos_token": "<|vision_end|>"}}),
    "qwen3": Family(151643, QWEN_SPECIAL_NAMES + QWEN3_EXTRA, "trl:qwen3", eos="<|im_end|>", pad="<|endoftext|>",
                    pinned=QWEN_PINNED, checks=QWEN_CHECKS, vocab_size=151936),
    "qwen3_5": Family(248044, QWEN_SPECIAL_NAMES + QWEN3_EXTRA, "trl:qwen3_5_nothink", eos="<|im_end|>",
                      pad="<|endoftext|>", pinned=QWEN35_PINNED, checks=QWEN35_CHECKS, vocab_size=248320,
                      extra={"extra_special_tokens": {"image_token": "<|image_pad|>", "video_token": "<|video_pad|>",
                                                      "vision_bos_token": "<|vision_start|>",
                                                      "vision_eos_token": "<|vision_end|>"}}),
    "qwen3_6": Family(248044, QWEN_SPECIAL_NAMES + QWEN3_EXTRA, "trl:qwen3_6", eos="<|im_end|>",
                      pad="<|endoftext|>", pinned=QWEN35_PINNED, checks=QWEN35_CHECKS, vocab_size=248320,
                      extra={"extra_special_tokens": {"image_token": "<|image_pad|>", "video_token": "<|video_pad|>",
                                                      "vision_bos_token": "<|vision_start|>",
                                                      "vision_eos_token": "<|vision_end|>"}}),
    "llama3_2": Family(SMALL, ["<|begin_of_text|>", "<|end_of_text|>", "<|reserved_special_token_0|>",
                               "<|reserved_special_token_1|>", "<|finetune_right_pad_id|>",
                               "<|reserved_special_token_2|>", "<|start_header_id|>", "<|end_header_id|>",
                               "<|eom_id|>", "<|eot_id|>", "<|python_tag|>"],
                       "trl:llama3_2", eos="<|eot_id|>", bos="<|begin_of_text|>", add_bos=True),
    "mistral": Family(SMALL, ["<unk>", "<s>", "</s>", "[INST]", "[/INST]"], MISTRAL_TEMPLATE, eos="</s>", bos="<s>",
                      unk="<unk>", add_bos=True),
    "gemma": Family(SMALL, ["<pad>", "<eos>", "<bos>", "<unk>", "<start_of_turn>", "<end_of_turn>"], "trl:gemma",
                    eos="<eos>", pad="<pad>", bos="<bos>", unk="<unk>", add_bos=True),
    "cohere2": Family(SMALL, ["<PAD>", "<UNK>", "<BOS_TOKEN>", "<EOS_TOKEN>", "<|START_OF_TURN_TOKEN|>",
                              "<|END_OF_TURN_TOKEN|>", "<|USER_TOKEN|>", "<|CHATBOT_TOKEN|>", "<|SYSTEM_TOKEN|>",
                              "<|START_RESPONSE|>", "<|END_RESPONSE|>", "<|START_THINKING|>", "<|END_THINKING|>"],
                      "trl:cohere2", eos="<|END_OF_TURN_TOKEN|>", pad="<PAD>", bos="<BOS_TOKEN>", unk="<UNK>",
                      add_bos=True),
    "glm4moe": Family(SMALL, ["<|endoftext|>", "[MASK]", "[gMASK]", "[sMASK]", "<sop>", "<eop>", "<|system|>",
                              "<|user|>", "<|assistant|>", "<|observation|>", "<think>", "</think>", "<tool_call>",
                              "</tool_call>", "<tool_response>", "</tool_response>", "<arg_key>", "</arg_key>",
                              "<arg_value>", "</arg_value>"],
                      "trl:glm4moe", eos="<|endoftext|>", pad="<|endoftext|>"),
    "gptoss": Family(SMALL, ["<|startoftext|>", "<|endoftext|>", "<|return|>", "<|constrain|>", "<|channel|>",
                             "<|start|>", "<|end|>", "<|message|>", "<|call|>"],
                     "trl:gptoss", eos="<|return|>", pad="<|endoftext|>"),
    "nemotron3": Family(SMALL, ["<unk>", "<s>", "</s>", "<|im_start|>", "<|im_end|>", "<think>", "</think>",
                                "<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>"],
                        "trl:nemotron_3_nano", eos="<|im_end|>", pad="<unk>", bos="<s>", unk="<unk>"),
}  # fmt: skip
