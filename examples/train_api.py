"""slimgrpo from Python (a notebook, a script): a config, a callback for custom logging and early
stopping, and the trainer.

    python examples/train_api.py
"""

from slimgrpo import Trainer, load_config
from slimgrpo.demo import MODEL_DIR, TRAIN_FILE


def print_reward(trainer, step, metrics):
    print(f"step {step}: reward {metrics['reward']:.3f}")
    return metrics["reward"] > 0.9  # returning True stops training early


cfg = load_config(None, [
    f"model.path={MODEL_DIR}", f"data.path={TRAIN_FILE}", "data.max_prompt_length=16",
    "rewards.functions=[slimgrpo.demo.task:demo_accuracy]", "rollout.max_completion_length=8",
    "run.batch_size=64", "run.max_steps=20", "optim.learning_rate=3e-4", "run.output_dir=outputs/api",
    "log.progress=false",
])
summary = Trainer(cfg, callbacks=[print_reward]).train()
print(summary["reward"])
