"""Vision-language stand-ins (model + processor), for the VLM model ids in TRL's GRPO tests.

Only processors that transformers can build without torchvision are made here: Gemma 3 and LLaVA-NeXT (their image
processors have PIL back ends and they carry no video processor). The Qwen2-VL / Qwen2.5-VL / Qwen3.5 / Gemma 4 /
SmolVLM processors all include a video processor, which transformers only provides with torchvision; torchvision
cannot be installed beside the torch 2.13.0 CPU wheel this harness pins, so those tests are reported as needing
torchvision (see TORCHVISION_MODELS, used by the pytest plugin) and no stand-in is built for them.
"""

from __future__ import annotations

from pathlib import Path

import torch

from benchmarks.trl_tests.standins.families import SMALL, Family, _specials, trl_template  # noqa: F401
from benchmarks.trl_tests.standins.toktools import build_tokenizer, wrap

# Model ids whose processor needs torchvision (a video processor); tests that load them are skipped by the harness
# with that reason when torchvision is not importable.
TORCHVISION_MODELS = {
    "trl-internal-testing/tiny-Qwen2VLForConditionalGeneration",
    "trl-internal-testing/tiny-Qwen2_5_VLForConditionalGeneration",
    "trl-internal-testing/tiny-Qwen3_5ForConditionalGeneration-NoThink",
    "trl-internal-testing/tiny-Qwen3_5MoeForConditionalGeneration-3.6",
    "trl-internal-testing/tiny-Gemma4ForConditionalGeneration",
    "trl-internal-testing/tiny-SmolVLMForConditionalGeneration",
    "HuggingFaceTB/SmolVLM-Instruct",
}


def _save(out: Path, model, processor, gen_config):
    model.save_pretrained(out)
    processor.save_pretrained(out)
    if gen_config is not None:
        gen_config.save_pretrained(out)


def _dtype():
    import os

    return {"float32": torch.float32, "bfloat16": torch.bfloat16}[os.environ.get("STANDIN_DTYPE", "float32")]


# ---------------------------------------------------------------------------------------------------------------- Gemma 3

GEMMA3_SPECIALS = ["<pad>", "<eos>", "<bos>", "<unk>", "<start_of_turn>", "<end_of_turn>", "<start_of_image>",
                   "<end_of_image>", "<image_soft_token>"]  # fmt: skip


def build_gemma3(out: Path):
    from transformers import (
        Gemma3Config,
        Gemma3ForConditionalGeneration,
        Gemma3Processor,
        GenerationConfig,
        SiglipVisionConfig,
    )
    from transformers.models.gemma3.image_processing_pil_gemma3 import Gemma3ImageProcessorPil

    n = SMALL
    ids = {name: n + i for i, name in enumerate(GEMMA3_SPECIALS)}
    tok = build_tokenizer(n_regular=n, specials=_specials(n, GEMMA3_SPECIALS), bos="<bos>", add_bos=True)
    template = trl_template("gemma3")
    tokenizer = wrap(
        tok,
        chat_template=template,
        eos_token="<eos>",
        pad_token="<pad>",
        bos_token="<bos>",
        unk_token="<unk>",
        extra_special_tokens={
            "boi_token": "<start_of_image>",
            "eoi_token": "<end_of_image>",
            "image_token": "<image_soft_token>",
        },
    )
    image_size, patch = 28, 14  # 2x2 patches, pooled to 4 soft tokens per image
    tokens_per_image = 4
    image_processor = Gemma3ImageProcessorPil(
        size={"height": image_size, "width": image_size},
        image_mean=[0.5, 0.5, 0.5],
        image_std=[0.5, 0.5, 0.5],
    )
    processor = Gemma3Processor(
        image_processor=image_processor,
        tokenizer=tokenizer,
        chat_template=template,
        image_seq_length=tokens_per_image,
    )
    vocab = n + len(GEMMA3_SPECIALS)
    text_config = dict(
        vocab_size=vocab, hidden_size=16, intermediate_size=32, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=8, query_pre_attn_scalar=8, layer_types=None,
        pad_token_id=ids["<pad>"], bos_token_id=ids["<bos>"], eos_token_id=ids["<eos>"],
    )  # fmt: skip
    vision_config = SiglipVisionConfig(
        hidden_size=16, intermediate_size=32, num_hidden_layers=2, num_attention_heads=4, image_size=image_size,
        patch_size=patch, vision_use_head=False,
    )  # fmt: skip
    config = Gemma3Config(
        text_config=text_config,
        vision_config=vision_config,
        mm_tokens_per_image=tokens_per_image,
        boi_token_index=ids["<start_of_image>"],
        eoi_token_index=ids["<end_of_image>"],
        image_token_index=ids["<image_soft_token>"],
    )
    torch.manual_seed(0)
    model = Gemma3ForConditionalGeneration(config).to(_dtype())
    gen = GenerationConfig(
        bos_token_id=ids["<bos>"], eos_token_id=[ids["<eos>"], ids["<end_of_turn>"]], pad_token_id=ids["<pad>"],
        do_sample=True, top_k=64, top_p=0.95,
    )  # fmt: skip
    _save(out, model, processor, gen)


# ------------------------------------------------------------------------------------------------------------ LLaVA-NeXT

LLAVA_NEXT_SPECIALS = ["<unk>", "<s>", "</s>", "<image>"]


def build_llava_next(out: Path):
    from transformers import (
        CLIPVisionConfig,
        GenerationConfig,
        LlavaNextConfig,
        LlavaNextForConditionalGeneration,
        LlavaNextProcessor,
        MistralConfig,
    )
    from transformers.models.llava_next.image_processing_pil_llava_next import LlavaNextImageProcessorPil

    n = SMALL
    ids = {name: n + i for i, name in enumerate(LLAVA_NEXT_SPECIALS)}
    tok = build_tokenizer(n_regular=n, specials=_specials(n, LLAVA_NEXT_SPECIALS), bos="<s>", add_bos=True)
    template = trl_template("llava_next")
    tokenizer = wrap(
        tok,
        chat_template=template,
        eos_token="</s>",
        bos_token="<s>",
        unk_token="<unk>",
        pad_token="<unk>",
        extra_special_tokens={"image_token": "<image>"},
    )
    side, patch = 28, 14
    pinpoints = [[side, side], [side, 2 * side], [2 * side, side]]
    image_processor = LlavaNextImageProcessorPil(
        size={"shortest_edge": side},
        crop_size={"height": side, "width": side},
        image_grid_pinpoints=pinpoints,
    )
    processor = LlavaNextProcessor(
        image_processor=image_processor,
        tokenizer=tokenizer,
        patch_size=patch,
        vision_feature_select_strategy="default",
        chat_template=template,
        num_additional_image_tokens=1,
    )
    vocab = n + len(LLAVA_NEXT_SPECIALS)
    text_config = MistralConfig(
        vocab_size=vocab, hidden_size=16, intermediate_size=32, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, pad_token_id=ids["<unk>"], bos_token_id=ids["<s>"], eos_token_id=ids["</s>"],
    )  # fmt: skip
    vision_config = CLIPVisionConfig(
        hidden_size=16, intermediate_size=32, num_hidden_layers=2, num_attention_heads=4, image_size=side,
        patch_size=patch, projection_dim=16,
    )  # fmt: skip
    config = LlavaNextConfig(
        text_config=text_config,
        vision_config=vision_config,
        image_token_index=ids["<image>"],
        image_grid_pinpoints=pinpoints,
        vision_feature_select_strategy="default",
        vision_feature_layer=-2,
    )
    torch.manual_seed(0)
    model = LlavaNextForConditionalGeneration(config).to(_dtype())
    gen = GenerationConfig(bos_token_id=ids["<s>"], eos_token_id=ids["</s>"], pad_token_id=ids["<unk>"])
    _save(out, model, processor, gen)


VLM_MODELS = {
    "trl-internal-testing/tiny-Gemma3ForConditionalGeneration": build_gemma3,
    "trl-internal-testing/tiny-LlavaNextForConditionalGeneration": build_llava_next,
}
