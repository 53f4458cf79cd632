#!/usr/bin/env python
"""Rebuild the assets of ``slimgrpo demo``: task data, tokenizer and warm-started tiny model.

    .venv/bin/python scripts/build_demo_model.py               # rebuild (~1 CPU-minute)
    .venv/bin/python scripts/build_demo_model.py --check-grpo  # + a throw-away GRPO check
    .venv/bin/python scripts/build_demo_model.py --grpo-only   # the check on the saved model
    .venv/bin/python scripts/build_demo_model.py --heads 2 --model-name model_h32   # the vLLM twin

Everything lands in ``src/slimgrpo/demo/`` (``data/`` and ``model/``) unless ``--out`` says
otherwise. ``model_h32/`` is the same recipe with 2 attention heads of 32 instead of 4 of 16: vLLM's CPU
attention takes head sizes of 32 and up, so ``slimgrpo demo rollout.engine=vllm`` runs on it. The task lives in ``slimgrpo.demo.task``; this script only builds and measures.

Reproducibility: seeds are fixed, the thread count is pinned (``--threads``, default 1) and
``torch.use_deterministic_algorithms(True)`` is on, so two runs on one machine give
byte-identical weights. Bit-exact agreement across machines needs the same torch version
(2.13.0 built the shipped weights) and the same CPU kernels; other versions give a model
of the same quality, not the same bytes. The data files do not depend on torch at all.

The supervised warm-start leaves the model unreliable on purpose: the demo needs a model
that is right only some of the time when sampling at temperature 1.0, yet right at least
once in most groups of 8 samples, so that GRPO's group-relative advantages carry signal.
It first learns exact sums, then imitates a sloppy teacher who often forgets the carry
(see ``sloppy_teacher_answer`` and docs/demo.md).
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import time
from pathlib import Path

import torch
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

from slimgrpo.demo.task import EOS_TEXT, NUM_EVAL, PAD_TEXT, demo_accuracy, make_splits

REPO_ROOT = Path(__file__).resolve().parents[1]
DEFAULT_OUT = REPO_ROOT / "src" / "slimgrpo" / "demo"

MODEL_SEED = 0
EVAL_SEED = 7  # sampling seed of every evaluation, so the numbers are comparable
EVAL_SAMPLES = 8  # samples per eval prompt: sampled accuracy and pass@8
MAX_NEW_TOKENS = 8  # answers need at most 4 tokens (3 digits + EOS); the rest is slack

CHARS = list("0123456789+-= ")  # space lets a sampled completion be "wrong with junk"
SPECIAL_TOKENS = [PAD_TEXT, EOS_TEXT, "<unk>"]


# ----------------------------------------------------------------------------- assets


def build_tokenizer() -> PreTrainedTokenizerFast:
    """Character-level tokenizer: one token per character, specials first (pad=0, eos=1)."""
    vocab = {tok: i for i, tok in enumerate(SPECIAL_TOKENS + CHARS)}
    backend = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    backend.decoder = decoders.Fuse()  # join characters back without spaces
    return PreTrainedTokenizerFast(
        tokenizer_object=backend,
        eos_token=EOS_TEXT,
        pad_token=PAD_TEXT,
        unk_token="<unk>",
        padding_side="left",  # prompts are left-padded for generation
        clean_up_tokenization_spaces=False,
    )


def save_tokenizer(tokenizer: PreTrainedTokenizerFast, folder: Path) -> None:
    """Save, then pin the tokenizer class so AutoTokenizer loads this exact tokenizer.

    Without ``tokenizer_class`` AutoTokenizer may pick a class from the model type in
    config.json and rebuild the tokenizer around our vocabulary (see ``build_model``).
    special_tokens_map.json is written for transformers 4.x, which reads it.
    """
    tokenizer.save_pretrained(folder)
    config_path = folder / "tokenizer_config.json"
    config = json.loads(config_path.read_text())
    config["tokenizer_class"] = "PreTrainedTokenizerFast"
    config_path.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    special = {"eos_token": EOS_TEXT, "pad_token": PAD_TEXT, "unk_token": "<unk>"}
    (folder / "special_tokens_map.json").write_text(json.dumps(special, indent=2) + "\n")


def build_model(tokenizer: PreTrainedTokenizerFast, seed: int, heads: int = 4) -> LlamaForCausalLM:
    """A ~0.1M-parameter Llama: 2 layers, hidden 64, tied embeddings, fp32; ``heads`` attention heads
    (4 of 16 for the demo's model; 2 of 32 for its twin ``model_h32``, whose head size vLLM's CPU attention takes).

    Llama rather than Qwen2 because transformers 5 lists ``qwen2`` among the model types
    whose AutoTokenizer always builds the model family's own tokenizer class, whatever
    tokenizer_config.json declares: with a Qwen2 config, AutoTokenizer would wrap our
    vocabulary in Qwen2's byte-level pre-tokenizer (which drops spaces between digits).
    """
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=64,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=heads,
        num_key_value_heads=heads,
        max_position_embeddings=64,
        tie_word_embeddings=True,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        bos_token_id=None,
    )
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config)
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    return model


def write_jsonl(rows: list[dict], path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as f:
        for row in rows:
            f.write(json.dumps(row) + "\n")


# ----------------------------------------------------------------------------- sampling


def encode_prompts(tokenizer, prompts: list[str]) -> torch.Tensor:
    """[groups, P] prompt ids; every demo prompt has the same length, so no padding."""
    ids = [tokenizer(p, add_special_tokens=False)["input_ids"] for p in prompts]
    if len({len(x) for x in ids}) != 1:
        raise ValueError("this script's sampler expects prompts of one length")
    return torch.tensor(ids, dtype=torch.long)


@torch.no_grad()
def sample(
    model,
    prompt_ids: torch.Tensor,  # [rows, P]
    eos_id: int,
    pad_id: int,
    temperature: float,  # 0 means greedy
    generator: torch.Generator,
    max_new_tokens: int = MAX_NEW_TOKENS,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Completions [rows, T] (pad after EOS) and their mask [rows, T] (True up to EOS).

    No KV cache: sequences are at most 14 tokens, and re-running them is simpler.
    """
    seq = prompt_ids
    done = torch.zeros(len(seq), dtype=torch.bool)
    new_tokens, masks = [], []
    for _ in range(max_new_tokens):
        logits = model(input_ids=seq).logits[:, -1, :].float()  # [rows, V]
        if temperature > 0:
            probs = torch.softmax(logits / temperature, dim=-1)
            token = torch.multinomial(probs, 1, generator=generator).squeeze(1)
        else:
            token = logits.argmax(dim=-1)
        masks.append(~done)
        token = torch.where(done, torch.full_like(token, pad_id), token)
        new_tokens.append(token)
        done = done | (token == eos_id)
        seq = torch.cat([seq, token[:, None]], dim=1)
        if bool(done.all()):
            break
    return torch.stack(new_tokens, dim=1), torch.stack(masks, dim=1)


def decode(tokenizer, completion_ids: torch.Tensor) -> list[str]:
    return tokenizer.batch_decode(completion_ids.tolist(), skip_special_tokens=True)


def evaluate(model, tokenizer, rows: list[dict], samples: int = EVAL_SAMPLES) -> dict:
    """Sampled accuracy (T=1.0, mean over samples), pass@samples, and greedy accuracy."""
    model.eval()
    prompts = [r["prompt"] for r in rows]
    answers = [r["answer"] for r in rows]
    prompt_ids = encode_prompts(tokenizer, prompts)
    gen = torch.Generator().manual_seed(EVAL_SEED)
    ids, _ = sample(
        model, prompt_ids.repeat_interleave(samples, 0), tokenizer.eos_token_id,
        tokenizer.pad_token_id, 1.0, gen,
    )
    rewards = torch.tensor(
        demo_accuracy(None, decode(tokenizer, ids), [a for a in answers for _ in range(samples)])
    ).view(len(rows), samples)
    greedy_ids, _ = sample(
        model, prompt_ids, tokenizer.eos_token_id, tokenizer.pad_token_id, 0.0, gen
    )
    greedy = demo_accuracy(None, decode(tokenizer, greedy_ids), answers)
    return {
        "sampled": rewards.mean().item(),
        f"pass@{samples}": (rewards.max(dim=1).values > 0).float().mean().item(),
        "greedy": sum(greedy) / len(greedy),
    }


def fmt_eval(stats: dict) -> str:
    return "  ".join(f"{k} {100 * v:5.1f}%" for k, v in stats.items())


# ----------------------------------------------------------------------------- warm-start


def encode_sft(tokenizer, rows: list[dict]) -> tuple[torch.Tensor, torch.Tensor]:
    """prompt+answer+EOS ids [N, L] right-padded, and the loss mask on answer+EOS tokens."""
    seqs, masks = [], []
    for r in rows:
        p = tokenizer(r["prompt"], add_special_tokens=False)["input_ids"]
        a = tokenizer(r["answer"], add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
        seqs.append(p + a)
        masks.append([False] * len(p) + [True] * len(a))
    width = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), width), tokenizer.pad_token_id, dtype=torch.long)
    mask = torch.zeros((len(seqs), width), dtype=torch.bool)
    for i, (s, m) in enumerate(zip(seqs, masks)):
        ids[i, : len(s)] = torch.tensor(s)
        mask[i, : len(m)] = torch.tensor(m)
    return ids, mask


def token_logprobs(model, ids: torch.Tensor) -> torch.Tensor:
    """log p(ids[:, t] | ids[:, :t]) for t >= 1, shape [N, L-1]."""
    logits = model(input_ids=ids).logits[:, :-1, :].float()
    return torch.log_softmax(logits, dim=-1).gather(-1, ids[:, 1:, None]).squeeze(-1)


def sloppy_teacher_answer(
    prompt: str, rng: random.Random, drop_carry: float, digit_noise: float
) -> str:
    """What a sloppy teacher writes for ``prompt``: the warm-start's training target.

    On problems whose units digits carry (a0 + b0 >= 10) it forgets the carry with
    probability ``drop_carry`` (37+48 -> 75 instead of 85); then it miscopies each digit
    with probability ``digit_noise`` (a uniformly random digit instead). Fresh draws
    every time, so the model learns the teacher's distribution rather than memorising
    one wrong answer per prompt.
    """
    a, b = (int(x) for x in prompt.rstrip("=").split("+"))
    total = a + b
    if (a % 10) + (b % 10) >= 10 and rng.random() < drop_carry:
        total -= 10
    return "".join(
        rng.choice("0123456789") if rng.random() < digit_noise else d for d in str(total)
    )


def warm_start(
    model, tokenizer, train_rows, eval_rows, clean_steps: int, sloppy_steps: int,
    batch_size: int, lr: float, eval_every: int, seed: int, drop_carry: float,
    digit_noise: float,
) -> list[tuple[int, str, dict]]:
    """Supervised next-token training on answer + EOS tokens, in two phases.

    Phase "exact" trains on the true sums for ``clean_steps`` (it teaches the structure
    of addition quickly); phase "sloppy" then trains on the sloppy teacher's answers for
    ``sloppy_steps``, which leaves a model that can add but is unreliable. The learning
    rate is constant, so stopping at step k gives exactly the table's row k.
    """
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    rng = random.Random(seed)
    total = clean_steps + sloppy_steps
    table = [(0, "-", evaluate(model, tokenizer, eval_rows))]
    print(f"  step {0:5d}  {fmt_eval(table[-1][2])}", flush=True)
    for step in range(1, total + 1):
        phase = "exact" if step <= clean_steps else "sloppy"
        model.train()
        batch = [
            {"prompt": r["prompt"],
             "answer": r["answer"] if phase == "exact"
             else sloppy_teacher_answer(r["prompt"], rng, drop_carry, digit_noise)}
            for r in rng.choices(train_rows, k=batch_size)
        ]
        ids, mask = encode_sft(tokenizer, batch)
        logp = token_logprobs(model, ids)
        m = mask[:, 1:].float()
        loss = -(logp * m).sum() / m.sum()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        if step % eval_every == 0 or step in (clean_steps, total):
            table.append((step, phase, evaluate(model, tokenizer, eval_rows)))
            print(f"  step {step:5d}  {phase:6s}  loss {loss.item():.3f}  "
                  f"{fmt_eval(table[-1][2])}", flush=True)
    return table


# ----------------------------------------------------------------------------- GRPO check


def check_grpo(model, tokenizer, train_rows, eval_rows, args) -> dict:
    """Throw-away GRPO loop: is there enough signal for accuracy to rise within minutes?

    One policy-gradient step per batch (so the PPO ratio is 1 and clipping is moot),
    group-normalised advantages, loss -A * logp averaged over completion tokens, no KL.
    """
    G = args.grpo_generations
    opt = torch.optim.AdamW(model.parameters(), lr=args.grpo_lr, weight_decay=0.0)
    rng = random.Random(args.grpo_seed)
    gen = torch.Generator().manual_seed(args.grpo_seed)
    eos, pad = tokenizer.eos_token_id, tokenizer.pad_token_id
    t0 = time.perf_counter()
    before = evaluate(model, tokenizer, eval_rows)
    print(f"  GRPO step {0:4d}  {fmt_eval(before)}", flush=True)
    history = [(0, before, 0.0)]
    for step in range(1, args.grpo_steps + 1):
        rows = rng.sample(train_rows, args.grpo_prompts)
        prompt_ids = encode_prompts(tokenizer, [r["prompt"] for r in rows]).repeat_interleave(G, 0)
        model.eval()
        completion_ids, completion_mask = sample(
            model, prompt_ids, eos, pad, args.grpo_temperature, gen, args.grpo_max_new_tokens
        )
        answers = [r["answer"] for r in rows for _ in range(G)]
        rewards = torch.tensor(demo_accuracy(None, decode(tokenizer, completion_ids), answers))
        grouped = rewards.view(-1, G)
        adv = ((grouped - grouped.mean(1, keepdim=True)) / (grouped.std(1, keepdim=True) + 1e-4))
        adv = adv.view(-1)  # [rows]
        model.train()
        seq = torch.cat([prompt_ids, completion_ids], dim=1)
        P = prompt_ids.shape[1]
        logp = token_logprobs(model, seq)[:, P - 1 :]  # [rows, T]
        m = completion_mask.float()
        loss = -(adv[:, None] * logp * m).sum() / m.sum()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if step % args.grpo_eval_every == 0 or step == args.grpo_steps:
            stats = evaluate(model, tokenizer, eval_rows)
            elapsed = time.perf_counter() - t0
            history.append((step, stats, elapsed))
            print(
                f"  GRPO step {step:4d}  train reward {rewards.mean().item():.2f}  "
                f"{fmt_eval(stats)}  {elapsed:5.1f}s",
                flush=True,
            )
    return {"before": before, "after": history[-1][1], "seconds": time.perf_counter() - t0,
            "history": history}


# ----------------------------------------------------------------------------- main


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    add = p.add_argument
    add("--out", type=Path, default=DEFAULT_OUT, help="folder that receives data/ and model/")
    add("--heads", type=int, default=4, help="attention heads of hidden size 64 (2: the vLLM twin, head size 32)")
    add("--model-name", default="model", help="subfolder of --out for the model (model_h32: the vLLM twin)")
    add("--threads", type=int, default=1, help="torch threads (pinned for reproducibility)")
    add("--seed", type=int, default=MODEL_SEED, help="seed of the init and warm-start batches")
    add("--clean-steps", type=int, default=600, help="warm-start steps on exact sums")
    add("--sloppy-steps", type=int, default=1000, help="warm-start steps on the sloppy teacher")
    add("--sft-batch", type=int, default=64, help="sequences per warm-start step")
    add("--sft-lr", type=float, default=3e-3, help="constant AdamW learning rate")
    add("--drop-carry", type=float, default=0.7, help="how often the teacher forgets a carry")
    add("--digit-noise", type=float, default=0.2, help="how often the teacher miscopies a digit")
    add("--sft-eval-every", type=int, default=100, help="a table row every N warm-start steps")
    add("--check-grpo", action="store_true", help="run the GRPO sanity check after building")
    add("--grpo-only", action="store_true", help="skip the build; check the saved model")
    add("--grpo-seed", type=int, default=0, help="seed of the check's batches and samples")
    add("--grpo-steps", type=int, default=150, help="optimizer steps of the check")
    add("--grpo-prompts", type=int, default=16, help="prompts per step")
    add("--grpo-generations", type=int, default=8, help="samples per prompt (group size)")
    add("--grpo-lr", type=float, default=3e-4, help="constant AdamW learning rate")
    add("--grpo-temperature", type=float, default=1.0, help="sampling temperature in training")
    add("--grpo-max-new-tokens", type=int, default=MAX_NEW_TOKENS, help="max_completion_length")
    add("--grpo-eval-every", type=int, default=25, help="held-out eval every N steps")
    return p.parse_args()


def main() -> None:
    args = parse_args()
    torch.set_num_threads(args.threads)
    torch.use_deterministic_algorithms(True)
    data_dir, model_dir = args.out / "data", args.out / args.model_name
    t_start = time.perf_counter()

    train_rows, eval_rows = make_splits()
    if args.grpo_only:
        tokenizer = PreTrainedTokenizerFast.from_pretrained(model_dir)
        model = LlamaForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    else:
        write_jsonl(train_rows, data_dir / "train.jsonl")
        write_jsonl(eval_rows, data_dir / "eval.jsonl")
        print(f"data: {len(train_rows)} train / {len(eval_rows)} eval prompts -> {data_dir}")

        tokenizer = build_tokenizer()
        model = build_model(tokenizer, args.seed, args.heads)
        n_params = sum(p.numel() for p in model.parameters())
        print(f"model: Llama {n_params / 1e3:.1f}K params, vocab {len(tokenizer)}")
        print(f"warm-start: {args.clean_steps} exact + {args.sloppy_steps} sloppy steps "
              f"(drop carry {args.drop_carry}, digit noise {args.digit_noise}), "
              f"batch {args.sft_batch}, lr {args.sft_lr}")
        print(f"eval: {NUM_EVAL} held-out prompts x {EVAL_SAMPLES} samples at T=1.0, and greedy")
        table = warm_start(
            model, tokenizer, train_rows, eval_rows, args.clean_steps, args.sloppy_steps,
            args.sft_batch, args.sft_lr, args.sft_eval_every, args.seed, args.drop_carry,
            args.digit_noise,
        )
        if model_dir.exists():
            shutil.rmtree(model_dir)
        model.save_pretrained(model_dir, safe_serialization=True)
        save_tokenizer(tokenizer, model_dir)
        for f in model_dir.iterdir():
            f.chmod(0o644)  # safetensors writes 0600; the files ship in the package
        size = sum(f.stat().st_size for f in model_dir.iterdir())
        print(f"saved {model_dir} ({size / 1e6:.2f} MB)  [{time.perf_counter() - t_start:.0f}s]")
        print("\n| step | phase | sampled acc (T=1) | greedy acc | pass@8 |")
        print("|---:|:---|---:|---:|---:|")
        for step, phase, s in table:
            print(f"| {step} | {phase} | {100 * s['sampled']:.1f}% | {100 * s['greedy']:.1f}% "
                  f"| {100 * s['pass@8']:.1f}% |")

    if args.check_grpo or args.grpo_only:
        print(f"\nGRPO check: {args.grpo_steps} steps x {args.grpo_prompts} prompts x "
              f"{args.grpo_generations} samples, lr {args.grpo_lr}, T {args.grpo_temperature}")
        result = check_grpo(model, tokenizer, train_rows, eval_rows, args)
        b, a = result["before"], result["after"]
        print(f"GRPO check: sampled {100 * b['sampled']:.1f}% -> {100 * a['sampled']:.1f}%, "
              f"greedy {100 * b['greedy']:.1f}% -> {100 * a['greedy']:.1f}%, "
              f"pass@8 {100 * b['pass@8']:.1f}% -> {100 * a['pass@8']:.1f}% "
              f"in {result['seconds']:.0f}s")
    print(f"total {time.perf_counter() - t_start:.0f}s")


if __name__ == "__main__":
    main()
