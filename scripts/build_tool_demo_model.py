"""Build the assets of ``slimgrpo demo --task tools``: data, a character tokenizer with three call tokens,
and a tiny Llama warm-started to call the ``add`` tool on a random fifth of the problems.

    PYTHONPATH=src python scripts/build_tool_demo_model.py            # writes src/slimgrpo/demo/tools/
    PYTHONPATH=src python scripts/build_tool_demo_model.py --steps 50 --out /tmp/x   # quick look

Reproducible: fixed seeds, one thread. The warm-start is supervised next-token training on the
tokens the model writes (the tool result tokens are context only). It teaches: one-digit sums answered
directly (learnable), four-digit sums answered directly (a guess: the model cannot add them), and with
probability ``--p-call`` the call format, copying the operands into the call and the tool's result into
the answer. See docs/agents.md for the measured before/after of GRPO.
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

import torch
from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

from slimgrpo.demo.task import EOS_TEXT, PAD_TEXT
from slimgrpo.demo.tools_task import (CALL_CLOSE, CALL_MID, CALL_OPEN, CHAT_TEMPLATE, TOOL_TEXT,
                                      make_splits)

REPO_ROOT = Path(__file__).resolve().parents[1]
DEFAULT_OUT = REPO_ROOT / "src" / "slimgrpo" / "demo" / "tools"
CHARS = list("0123456789+=")


def build_tokenizer() -> PreTrainedTokenizerFast:
    specials = [PAD_TEXT, EOS_TEXT, "<unk>", TOOL_TEXT]
    vocab = {tok: i for i, tok in enumerate(specials + CHARS + [CALL_OPEN, CALL_MID, CALL_CLOSE])}
    backend = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    backend.decoder = decoders.Fuse()
    backend.add_special_tokens([AddedToken(t, normalized=False) for t in specials])
    backend.add_tokens([AddedToken(t, normalized=False) for t in (CALL_OPEN, CALL_MID, CALL_CLOSE)])
    tok = PreTrainedTokenizerFast(tokenizer_object=backend, eos_token=EOS_TEXT, pad_token=PAD_TEXT,
                                  unk_token="<unk>", padding_side="left", clean_up_tokenization_spaces=False)
    tok.chat_template = CHAT_TEMPLATE
    return tok


def save_tokenizer(tok, folder: Path) -> None:
    tok.save_pretrained(folder)
    path = folder / "tokenizer_config.json"
    config = json.loads(path.read_text())
    config["tokenizer_class"] = "PreTrainedTokenizerFast"
    path.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")


def build_model(tok, seed: int) -> LlamaForCausalLM:
    config = LlamaConfig(vocab_size=len(tok), hidden_size=64, intermediate_size=256, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=64,
                         tie_word_embeddings=True, pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id,
                         bos_token_id=None)
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config)
    model.generation_config.pad_token_id = tok.pad_token_id
    model.generation_config.eos_token_id = tok.eos_token_id
    return model


def trajectory(tok, row: dict, call: bool, rng: random.Random) -> tuple[list[int], list[bool]]:
    """Token ids of prompt + what the model writes (+ tool result), and the mask of model-written ids."""
    enc = lambda s: tok(s, add_special_tokens=False)["input_ids"]  # noqa: E731
    eos = tok.eos_token_id
    a, b = row["prompt"].rstrip("=").split("+")
    p = enc(row["prompt"])
    if not call:
        ans = row["answer"]
        if len(a) > 1:  # a four-digit sum the model cannot do: the teacher guesses too (plausible digits)
            ans = str(int(ans) + rng.choice([-1, 1]) * rng.randint(1, 999)) if rng.random() < 0.9 else ans
        out = enc(ans) + [eos]
        return p + out, [False] * len(p) + [True] * len(out)
    c = enc(CALL_OPEN + a + CALL_MID + b + CALL_CLOSE) + [eos]
    t = enc(TOOL_TEXT + row["answer"]) + [eos]
    f = enc(row["answer"]) + [eos]
    return p + c + t + f, [False] * len(p) + [True] * len(c) + [False] * len(t) + [True] * len(f)


def warm_start(model, tok, rows, steps: int, batch: int, lr: float, p_call: float, seed: int) -> None:
    rng = random.Random(seed)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    model.train()
    for step in range(1, steps + 1):
        seqs = [trajectory(tok, r, rng.random() < p_call, rng) for r in rng.choices(rows, k=batch)]
        L = max(len(s) for s, _ in seqs)
        ids = torch.full((batch, L), tok.pad_token_id, dtype=torch.long)
        mask = torch.zeros(batch, L, dtype=torch.bool)
        for i, (s, m) in enumerate(seqs):
            ids[i, : len(s)] = torch.tensor(s)
            mask[i, : len(m)] = torch.tensor(m)
        logits = model(input_ids=ids).logits[:, :-1].float()
        logp = torch.log_softmax(logits, -1).gather(-1, ids[:, 1:, None])[..., 0]
        m = mask[:, 1:].float()
        loss = -(logp * m).sum() / m.sum()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        if step % 200 == 0 or step == steps:
            print(f"  step {step:5d}  loss {loss.item():.3f}", flush=True)
    model.eval()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    ap.add_argument("--steps", type=int, default=3000)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--p-call", type=float, default=0.2, help="share of warm-start examples that call the tool")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    torch.set_num_threads(1)
    train, evals = make_splits()
    out = args.out
    (out / "data").mkdir(parents=True, exist_ok=True)
    for name, rows in (("train", train), ("eval", evals)):
        (out / "data" / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    tok = build_tokenizer()
    model = build_model(tok, args.seed)
    print(f"model: Llama {sum(p.numel() for p in model.parameters()) / 1e3:.1f}K params, vocab {len(tok)}")
    warm_start(model, tok, train, args.steps, args.batch, args.lr, args.p_call, args.seed)
    (out / "model").mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out / "model", safe_serialization=True)
    save_tokenizer(tok, out / "model")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
