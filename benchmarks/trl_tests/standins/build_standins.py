"""Build local stand-ins for every hub model and data set that TRL's GRPO tests load, and lay them out so that the
unchanged test file finds them with the hub switched off.

Models go into the hub cache (``$HF_HOME/hub/models--ORG--NAME/snapshots/<rev>/``, ``refs/main`` naming the
revision), which is where ``from_pretrained`` looks when ``HF_HUB_OFFLINE=1``.

Data sets go into the ``datasets`` cache (``$HF_HOME/datasets/ORG___NAME/CONFIG/0.0.0/<hash>/``), which is where
``load_dataset("ORG/NAME", CONFIG)`` falls back to when offline (plain, dict and ``streaming=True`` loads all work
from it). They are prepared by loading a local folder with the same configs, splits and columns.

Usage (from the repository root, in the harness's venv): python -m benchmarks.trl_tests.standins.build_standins --hf-home DIR
[--only NAME ...] [--list]
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

import torch

from benchmarks.trl_tests.standins.families import FAMILIES

TINY = dict(hidden_size=8, num_attention_heads=4, num_key_value_heads=2, num_hidden_layers=2, intermediate_size=32)


def revision_for(repo_id: str) -> str:
    return hashlib.sha1(f"slimgrpo-standin:{repo_id}".encode()).hexdigest()


def install_snapshot(hf_home: Path, repo_id: str, src: Path, repo_type: str = "model") -> Path:
    """Copy ``src`` into the hub cache as the ``main`` revision of ``repo_id``."""
    org, name = repo_id.split("/")
    root = hf_home / "hub" / f"{repo_type}s--{org}--{name}"
    rev = revision_for(repo_id)
    if root.exists():
        shutil.rmtree(root)
    snap = root / "snapshots" / rev
    shutil.copytree(src, snap)
    (root / "refs").mkdir(parents=True, exist_ok=True)
    (root / "refs" / "main").write_text(rev)
    return snap


# ----------------------------------------------------------------------------------------------------------------
# Generation configs (sampling defaults in the spirit of the instruct checkpoints the tiny models copy theirs from).


def generation_config(family, **sampling):
    from transformers import GenerationConfig

    fam = FAMILIES[family]
    eos = fam.token_id(fam.eos)
    kwargs = dict(eos_token_id=eos)
    if fam.bos:
        kwargs["bos_token_id"] = fam.token_id(fam.bos)
    if fam.pad:
        kwargs["pad_token_id"] = fam.token_id(fam.pad)
    kwargs.update(sampling)
    return GenerationConfig(**kwargs)


QWEN_SAMPLING = dict(do_sample=True, temperature=0.7, top_p=0.8, top_k=20, repetition_penalty=1.05)


def special_ids(family):
    fam = FAMILIES[family]
    out = {"eos_token_id": fam.token_id(fam.eos)}
    if fam.bos:
        out["bos_token_id"] = fam.token_id(fam.bos)
    if fam.pad:
        out["pad_token_id"] = fam.token_id(fam.pad)
    return out


# Weight dtype of the saved stand-ins (``--dtype``). The hub's tiny models are bf16; fp32 is the default here because
# TRL's chunked LM-head kernel upcasts every vocabulary tile on the CPU, which makes bf16 weights several times slower.
SAVE_DTYPE = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def save_text_model(out: Path, model, tokenizer, gen_config, dtype=None, keep_fp32=()):
    model = model.to(dtype=dtype or SAVE_DTYPE[os.environ.get("STANDIN_DTYPE", "float32")])
    for name, param in model.named_parameters():
        if any(name.endswith(suffix) for suffix in keep_fp32):
            param.data = param.data.float()
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    if gen_config is not None:
        gen_config.save_pretrained(out)


# ----------------------------------------------------------------------------------------------------------------
# Text models. Each builder writes a complete model folder (weights, config, tokenizer, generation config).


def _tok(family):
    tok, problems = FAMILIES[family].build()
    for p in problems:
        print(f"  [tokenizer {family}] WARNING {p}")
    return tok


def build_causal(cls_name, config_name, family, extra=None, keep_fp32=(), sampling=None):
    def builder(out: Path):
        import transformers

        fam = FAMILIES[family]
        cfg_cls = getattr(transformers, config_name)
        kwargs = dict(TINY, vocab_size=fam.model_vocab_size(), **special_ids(family))
        kwargs.update(extra or {})
        config = cfg_cls(**kwargs)
        torch.manual_seed(0)
        model = getattr(transformers, cls_name)(config)
        save_text_model(out, model, _tok(family), generation_config(family, **(sampling or {})), keep_fp32=keep_fp32)

    return builder


def build_seq_cls(cls_name, config_name, family, extra=None):
    def builder(out: Path):
        import transformers

        fam = FAMILIES[family]
        cfg_cls = getattr(transformers, config_name)
        kwargs = dict(TINY, vocab_size=fam.model_vocab_size(), num_labels=1, **special_ids(family))
        kwargs.update(extra or {})
        config = cfg_cls(**kwargs)
        torch.manual_seed(0)
        model = getattr(transformers, cls_name)(config)
        save_text_model(out, model, _tok(family), None)

    return builder


REMOTE_CONFIG_PY = '''\
from transformers import LlamaConfig


class RemoteConfig(LlamaConfig):
    """A Llama configuration under its own model type, so that loading it needs trust_remote_code."""

    model_type = "remote"
'''

REMOTE_MODELING_PY = '''\
from transformers import LlamaForCausalLM, LlamaModel

from .configuration_remote import RemoteConfig


class RemoteModel(LlamaModel):
    config_class = RemoteConfig


class RemoteForCausalLM(LlamaForCausalLM):
    config_class = RemoteConfig
'''


def build_remote(out: Path):
    """A causal LM whose classes live in the repository (``auto_map``), as with ``trust_remote_code`` models."""
    import transformers

    family = "llama3_2"
    fam = FAMILIES[family]
    config = transformers.LlamaConfig(**TINY, vocab_size=fam.model_vocab_size(), **special_ids(family))
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config)
    save_text_model(out, model, _tok(family), generation_config(family))
    (out / "configuration_remote.py").write_text(REMOTE_CONFIG_PY)
    (out / "modeling_remote.py").write_text(REMOTE_MODELING_PY)
    cfg = json.loads((out / "config.json").read_text())
    cfg["model_type"] = "remote"
    cfg["architectures"] = ["RemoteForCausalLM"]
    cfg["auto_map"] = {
        "AutoConfig": "configuration_remote.RemoteConfig",
        "AutoModel": "modeling_remote.RemoteModel",
        "AutoModelForCausalLM": "modeling_remote.RemoteForCausalLM",
    }
    (out / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")


MODELS = {
    # --- Qwen2.5 vocabulary
    "trl-internal-testing/tiny-Qwen2ForCausalLM-2.5": build_causal(
        "Qwen2ForCausalLM", "Qwen2Config", "qwen2_5", sampling=QWEN_SAMPLING
    ),
    "trl-internal-testing/tiny-Qwen2ForSequenceClassification-2.5": build_seq_cls(
        "Qwen2ForSequenceClassification", "Qwen2Config", "qwen2_5"
    ),
    # Used only by the vLLM tests (real model "too big for tiny"); the stand-in is a tiny Qwen2 all the same.
    "Qwen/Qwen2.5-0.5B-Instruct": build_causal("Qwen2ForCausalLM", "Qwen2Config", "qwen2_5", sampling=QWEN_SAMPLING),
    # --- Qwen3 vocabulary
    "trl-internal-testing/tiny-Qwen3ForCausalLM": build_causal(
        "Qwen3ForCausalLM", "Qwen3Config", "qwen3", extra=dict(head_dim=8), sampling=QWEN_SAMPLING
    ),
    "trl-internal-testing/tiny-Qwen3ForSequenceClassification": build_seq_cls(
        "Qwen3ForSequenceClassification", "Qwen3Config", "qwen3", extra=dict(head_dim=8)
    ),
    "trl-internal-testing/tiny-Qwen3MoeForCausalLM": build_causal(
        "Qwen3MoeForCausalLM",
        "Qwen3MoeConfig",
        "qwen3",
        extra=dict(head_dim=8, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=16, norm_topk_prob=True),
        sampling=QWEN_SAMPLING,
    ),
    # --- other text families
    "trl-internal-testing/tiny-Cohere2ForCausalLM": build_causal("Cohere2ForCausalLM", "Cohere2Config", "cohere2"),
    "trl-internal-testing/tiny-Glm4MoeForCausalLM": build_causal(
        "Glm4MoeForCausalLM",
        "Glm4MoeConfig",
        "glm4moe",
        extra=dict(moe_intermediate_size=16, n_routed_experts=4, num_experts_per_tok=2, n_shared_experts=1,
                   first_k_dense_replace=1, n_group=1, topk_group=1, head_dim=8, num_mtp_layers=0),
    ),  # fmt: skip
    "trl-internal-testing/tiny-GptOssForCausalLM": build_causal(
        "GptOssForCausalLM", "GptOssConfig", "gptoss", extra=dict(num_local_experts=4, num_experts_per_tok=2, head_dim=8)
    ),
    "trl-internal-testing/tiny-NemotronHForCausalLM-nano": build_causal(
        "NemotronHForCausalLM",
        "NemotronHConfig",
        "nemotron3",
        extra=dict(hidden_size=16, layers_block_type=["mamba", "attention", "moe"], num_hidden_layers=3,
                   mamba_num_heads=8, mamba_head_dim=4, n_groups=1, ssm_state_size=16, conv_kernel=4, expand=2,
                   n_routed_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
                   moe_shared_expert_intermediate_size=32, head_dim=4),
        keep_fp32=("mixer.A_log", "mixer.D"),
    ),  # fmt: skip
    "trl-internal-testing/tiny-Gemma2ForCausalLM": build_causal(
        "Gemma2ForCausalLM", "Gemma2Config", "gemma", extra=dict(head_dim=8, query_pre_attn_scalar=8)
    ),
    "trl-internal-testing/tiny-LlamaForCausalLM-3.2": build_causal(
        "LlamaForCausalLM", "LlamaConfig", "llama3_2", extra=dict(tie_word_embeddings=True)
    ),
    "trl-internal-testing/tiny-LlamaForSequenceClassification-3.2": build_seq_cls(
        "LlamaForSequenceClassification", "LlamaConfig", "llama3_2"
    ),
    "trl-internal-testing/tiny-MistralForCausalLM-0.2": build_causal("MistralForCausalLM", "MistralConfig", "mistral"),
    "trl-internal-testing/tiny-RemoteForCausalLM": build_remote,
}


# ----------------------------------------------------------------------------------------------------------------
# Data sets. The Zen of Python (PEP 20, public domain) is the text of TRL's `zen` test sets; the prompt-only
# configs cut each aphorism short. 19 rows, the last 2 (10 %) form the `test` split, in order.

ZEN_PROMPTS = [
    "Beautiful is better than", "Explicit is", "Simple is better", "Complex", "Flat is better than",
    "Sparse is better", "Readability", "Special cases aren't special", "Although practicality beats",
    "Errors should never", "Unless explicitly", "In the face of ambiguity, refuse",
    "There should be one-- and preferably", "Although that way may not be obvious at first unless you're",
    "Now is", "Although never is often", "If the implementation is hard to explain,",
    "If the implementation is easy", "Namespaces are one honking great",
]  # fmt: skip

ZEN_QUESTIONS = [
    "What is better than ugly?", "What is better than implicit?", "What is better than complex?",
    "What is better than complicated?", "What is better than nested?", "What is better than dense?",
    "What counts?", "Are special cases enough to break the rules?", "What beats purity?",
    "What should never pass silently?", "When can errors pass silently?",
    "What should you do in the face of ambiguity?", "How many ways should there be to do it?",
    "For whom may the way not be obvious at first?", "What is better than never?",
    "Is never better than *right* now?", "What does it mean if the implementation is hard to explain?",
    "What does it mean if the implementation is easy to explain?", "Any great ideas?",
]  # fmt: skip

# Where images go in each multi-image prompt: "i" an image, "t" the question.
MULTI_IMAGE_LAYOUT = [
    "it", "ti", "iti", "iit", "it", "ti", "iti", "t", "tii", "iiti", "it", "ti", "itii", "t", "ti", "it", "it", "ti",
    "t",
]  # fmt: skip


def _split(rows: dict, features=None):
    from datasets import Dataset

    ds = Dataset.from_dict(rows, features=features)
    return ds.train_test_split(test_size=0.1, shuffle=False)


def _images(n, seed):
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        h, w = rng.integers(32, 64, size=2)
        out.append(Image.fromarray(rng.integers(0, 256, size=(h, w, 3), dtype=np.uint8)))
    return out


def dataset_zen():
    return {
        "standard_prompt_only": _split({"prompt": list(ZEN_PROMPTS)}),
        "conversational_prompt_only": _split({"prompt": [[{"role": "user", "content": q}] for q in ZEN_QUESTIONS]}),
    }


def dataset_zen_image():
    from datasets import Features, Image, List, Value

    message = List({"content": Value("string"), "role": Value("string")})
    rows = {"prompt": [[{"role": "user", "content": q}] for q in ZEN_QUESTIONS], "image": _images(19, seed=1)}
    return {"conversational_prompt_only": _split(rows, Features(prompt=message, image=Image()))}


def dataset_zen_multi_image():
    from datasets import Features, Image, List, Value

    part = {"text": Value("string"), "type": Value("string")}
    message = List({"content": List(part), "role": Value("string")})
    prompts, images = [], []
    for i, (q, layout) in enumerate(zip(ZEN_QUESTIONS, MULTI_IMAGE_LAYOUT, strict=True)):
        content = [{"type": "image", "text": None} if c == "i" else {"type": "text", "text": q} for c in layout]
        prompts.append([{"role": "user", "content": content}])
        images.append(_images(layout.count("i"), seed=100 + i))
    rows = {"prompt": prompts, "images": images}
    return {"conversational_prompt_only": _split(rows, Features(prompt=message, images=List(Image())))}


DATASETS = {
    "trl-internal-testing/zen": dataset_zen,
    "trl-internal-testing/zen-image": dataset_zen_image,
    "trl-internal-testing/zen-multi-image": dataset_zen_multi_image,
}


def install_dataset(hf_home: Path, repo_id: str, configs: dict, work: Path):
    """Write ``configs`` as parquet files in a local folder named like the repo, load each config once through
    ``load_dataset`` so that the datasets cache holds it, then move that cache entry under the hub repo's name."""
    import datasets

    org, name = repo_id.split("/")
    src = work / "datasets-src" / name
    if src.exists():
        shutil.rmtree(src)
    src.mkdir(parents=True)
    card = ["---", "configs:"]
    for config_name, dsd in configs.items():
        (src / config_name).mkdir()
        card.append(f"- config_name: {config_name}")
        card.append("  data_files:")
        for split, ds in dsd.items():
            ds.to_parquet(str(src / config_name / f"{split}-00000-of-00001.parquet"))
            card.append(f"  - split: {split}")
            card.append(f"    path: {config_name}/{split}-*")
    card.append("---")
    (src / "README.md").write_text("\n".join(card) + "\n")

    cache = hf_home / "datasets"
    target = cache / f"{org}___{name}"
    if target.exists():
        shutil.rmtree(target)
    for config_name, dsd in configs.items():
        before = {p.name for p in cache.iterdir()} if cache.exists() else set()
        loaded = datasets.load_dataset(str(src), config_name, cache_dir=str(cache))
        for split, ds in dsd.items():
            assert loaded[split].num_rows == ds.num_rows, (repo_id, config_name, split)
            assert loaded[split].column_names == ds.column_names, (repo_id, config_name, split)
        # The local load is cached under the folder's name, with arrow files named "<name>-<split>.arrow", which is
        # what the offline hub load expects under "<org>___<name>".
        produced = cache / name / config_name
        assert produced.is_dir(), f"datasets cache layout changed: {sorted(set(p.name for p in cache.iterdir()) - before)}"
        target.mkdir(parents=True, exist_ok=True)
        if (target / config_name).exists():
            shutil.rmtree(target / config_name)
        shutil.move(str(produced), str(target / config_name))
        shutil.rmtree(cache / name, ignore_errors=True)
    for lock in cache.glob("*.lock"):
        lock.unlink()
    # Also keep the raw files in the hub cache, as the hub would have them (not needed by the offline load path).
    install_snapshot(hf_home, repo_id, src, repo_type="dataset")


# ----------------------------------------------------------------------------------------------------------------


from benchmarks.trl_tests.standins.vlm_standins import TORCHVISION_MODELS as NEEDS_TORCHVISION  # noqa: E402
from benchmarks.trl_tests.standins.vlm_standins import VLM_MODELS  # noqa: E402

# Hub ids that appear in the test file but get no stand-in, with the reason.
NOT_BUILT = {
    "trl-internal-testing/tiny-LlavaForConditionalGeneration": "named only in a condition of test_train_vlm, never loaded",
    "kernels-community/flash-attn2": "a compiled hub kernel (attn_implementation); GPU-only slow test",
    **{repo_id: "processor needs torchvision (video processor)" for repo_id in sorted(NEEDS_TORCHVISION)},
}


def all_models():
    return {**MODELS, **VLM_MODELS}


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--hf-home", required=True, type=Path)
    parser.add_argument("--only", nargs="*", help="build only these repo ids")
    parser.add_argument("--list", action="store_true", help="list the repo ids and exit")
    parser.add_argument("--skip-datasets", action="store_true")
    parser.add_argument("--skip-models", action="store_true")
    parser.add_argument("--dtype", choices=sorted(SAVE_DTYPE), default="float32", help="weight dtype of the models")
    args = parser.parse_args()
    os.environ["STANDIN_DTYPE"] = args.dtype

    models = all_models()
    if args.list:
        for repo_id in list(models) + list(DATASETS):
            print(repo_id)
        return

    hf_home = args.hf_home.resolve()
    hf_home.mkdir(parents=True, exist_ok=True)
    os.environ["HF_HOME"] = str(hf_home)
    work = hf_home.parent / "standins-build"
    work.mkdir(parents=True, exist_ok=True)
    manifest_path = hf_home / "standins.json"
    manifest = json.loads(manifest_path.read_text()) if manifest_path.exists() else {"models": {}, "datasets": {}}

    failures = []
    if not args.skip_models:
        for repo_id, builder in models.items():
            if args.only and repo_id not in args.only:
                continue
            t0 = time.time()
            with tempfile.TemporaryDirectory(dir=work) as tmp:
                out = Path(tmp) / "model"
                out.mkdir()
                try:
                    builder(out)
                except Exception as exc:  # keep going: report every stand-in that cannot be built
                    failures.append((repo_id, repr(exc)))
                    print(f"FAILED {repo_id}: {exc!r}")
                    continue
                snap = install_snapshot(hf_home, repo_id, out)
            files = sorted(p.name for p in snap.iterdir())
            manifest["models"][repo_id] = {"revision": revision_for(repo_id), "files": files}
            print(f"model   {repo_id}  ({time.time() - t0:.1f}s)")

    if not args.skip_datasets:
        for repo_id, make in DATASETS.items():
            if args.only and repo_id not in args.only:
                continue
            configs = make()
            install_dataset(hf_home, repo_id, configs, work)
            manifest["datasets"][repo_id] = {
                cfg: {split: {"rows": ds.num_rows, "columns": ds.column_names} for split, ds in dsd.items()}
                for cfg, dsd in configs.items()
            }
            print(f"dataset {repo_id}  configs={list(configs)}")

    manifest["needs_torchvision"] = sorted(NEEDS_TORCHVISION) if importlib.util.find_spec("torchvision") is None else []
    manifest["not_built"] = NOT_BUILT
    manifest_path.write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")
    if failures:
        print(f"{len(failures)} stand-in(s) could not be built:")
        for repo_id, err in failures:
            print(f"  {repo_id}: {err}")
        sys.exit(1)


if __name__ == "__main__":
    main()
