"""The real vLLM engine against the policy it samples for; run inside an environment with vLLM installed
(tests/rollout/test_vllm_slow.py runs it with that environment's Python): ``python tests/vllm_real_check.py WORKDIR``.

Checks, on a tiny Qwen2 model whose head size vLLM's CPU attention takes (32):
1. greedy completions equal the built-in engine's on the same weights;
2. a perturbed weight (an in-place edit of the live policy) changes vLLM's greedy output to the built-in
   engine's on the perturbed weights, and restoring it restores the first output exactly;
3. sampled tokens' log-probs (temperature 1) match the policy's own forward (fp32), also after the tied
   embedding / LM head changed (vLLM's packed CPU head must be refreshed);
4. LoRA: after an adapter change (merged into the synced weights) greedy output equals the peft model's.
Prints one JSON line with the figures (sync seconds, start-up, log-prob differences); exits non-zero on failure.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))


def build_model(folder: Path):
    from transformers import AutoModelForCausalLM, Qwen2Config

    from tiny_models import build_tokenizer  # conftest's, without pytest (not in the vLLM environment)

    tok = build_tokenizer(folder)
    torch.manual_seed(0)
    conf = Qwen2Config(vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                       num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=256,
                       tie_word_embeddings=True, pad_token_id=0, eos_token_id=1, bos_token_id=2)
    model = AutoModelForCausalLM.from_config(conf)
    for p in model.parameters():  # a sharper random model: greedy ties (and near-ties) become unlikely
        p.data.mul_(8.0) if p.dim() == 2 else None
    model.save_pretrained(str(folder), safe_serialization=True)
    return AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32), tok


def policy_logprobs(model, rollout):
    ids, mask = rollout.row_prompt_ids()
    full = torch.cat([ids, rollout.completion_ids], 1)
    am = torch.cat([mask, rollout.completion_mask], 1).long()
    with torch.no_grad():
        logits = model(input_ids=full, attention_mask=am).logits[:, ids.shape[1] - 1:-1]
    return torch.log_softmax(logits.float(), -1).gather(-1, rollout.completion_ids[..., None])[..., 0]


def main(workdir: str) -> int:
    from slimgrpo.rollout.engine import TorchRolloutEngine
    from slimgrpo.rollout.sampling import SamplingParams
    from slimgrpo.rollout.costs import MIN_KV_BYTES
    from slimgrpo.rollout import vllm_engine as ve

    out: dict = {}
    folder = Path(workdir) / "model"
    folder.mkdir(parents=True, exist_ok=True)
    model, tok = build_model(folder)
    settings = ve.VllmSettings(model_path=str(folder), dtype="float32", device="cpu", max_model_len=128,
                               max_num_seqs=16, kv_cache_bytes=MIN_KV_BYTES)
    t = time.perf_counter()
    engine = ve.VllmRolloutEngine(model, settings)
    out["start_s"] = round(time.perf_counter() - t, 2)
    prompts = [tok.encode("What is 12 plus 30?"), tok.encode("Tom has 3 apples")]
    greedy = SamplingParams(max_new_tokens=16, temperature=0.0, eos_token_ids=(1,), pad_token_id=0)
    ours = TorchRolloutEngine(model)

    def both():
        a = engine.generate(prompts, 2, greedy)
        b = ours.generate(prompts, 2, greedy)
        return a, b

    a, b = both()
    assert torch.equal(a.completion_ids, b.completion_ids), (a.completion_ids, b.completion_ids)
    assert torch.equal(a.is_truncated, b.is_truncated)
    first = a.completion_ids.clone()
    out["sync_s_first"] = round(engine.metrics["rollout/weight_sync_s"], 3)

    w = model.model.layers[1].mlp.down_proj.weight
    saved = w.detach().clone()
    with torch.no_grad():
        w.add_(torch.randn_like(w) * w.std() * 4)
    a, b = both()
    assert engine.sync_count == 2, engine.sync_count
    assert not torch.equal(a.completion_ids, first), "a perturbed weight did not change vLLM's greedy output"
    assert torch.equal(a.completion_ids, b.completion_ids), (a.completion_ids, b.completion_ids)
    out["sync_s_full_ft"] = round(engine.metrics["rollout/weight_sync_s"], 3)
    with torch.no_grad():
        w.copy_(saved)
    a, _ = both()
    assert torch.equal(a.completion_ids, first), "restoring the weight did not restore the output"

    sampled = SamplingParams(max_new_tokens=16, temperature=1.0, eos_token_ids=(1,), pad_token_id=0)
    g = torch.Generator().manual_seed(3)
    r = engine.generate(prompts * 4, 4, sampled, g)
    m = r.completion_mask
    diff = (r.sampler_logprobs - policy_logprobs(model, r)).abs()[m]
    out["logprob_diff_max_fp32"] = float(diff.max())
    assert out["logprob_diff_max_fp32"] < 1e-3, out
    r2 = engine.generate(prompts * 4, 4, sampled, torch.Generator().manual_seed(3))
    out["same_seed_same_samples"] = bool(torch.equal(r.completion_ids, r2.completion_ids))
    # The tied embedding / LM head: vLLM reloads the embedding only; its packed CPU head must follow.
    with torch.no_grad():
        model.model.embed_tokens.weight.add_(torch.randn_like(model.model.embed_tokens.weight))
    r = engine.generate(prompts * 4, 4, sampled, g)
    out["logprob_diff_max_tied_head_changed"] = float((r.sampler_logprobs - policy_logprobs(model, r)).abs()[r.completion_mask].max())
    assert out["logprob_diff_max_tied_head_changed"] < 1e-3, out
    engine.close()

    from peft import LoraConfig, get_peft_model

    peft_model = get_peft_model(model, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj", "down_proj"]))
    lora_engine = ve.VllmRolloutEngine(peft_model, settings)
    ours = TorchRolloutEngine(peft_model, pack_weights="none")
    lora_engine.generate(prompts, 2, greedy)  # the first sync
    with torch.no_grad():
        for n, p in peft_model.named_parameters():
            if "lora_B" in n:
                p.normal_(std=2.0)
    a = lora_engine.generate(prompts, 2, greedy)
    b = ours.generate(prompts, 2, greedy)
    out["sync_s_lora"] = round(lora_engine.metrics["rollout/weight_sync_s"], 3)
    assert not torch.equal(a.completion_ids, first), "the adapter did not reach vLLM"
    assert torch.equal(a.completion_ids, b.completion_ids), (a.completion_ids, b.completion_ids)
    lora_engine.close()
    print(json.dumps({"ok": True, **out}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
