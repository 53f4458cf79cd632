import subprocess
import sys

import pytest
import yaml

from slimgrpo.commands.cli import main


def run_cli(*args):
    return subprocess.run([sys.executable, "-m", "slimgrpo", *args], capture_output=True, text=True, timeout=120)


def test_help_lists_commands():
    out = run_cli("--help")
    assert out.returncode == 0
    for cmd in ("train", "plan", "eval", "report", "demo"):
        assert cmd in out.stdout


def test_train_help_and_help_config(capsys):
    assert run_cli("train", "--help").returncode == 0
    assert main(["train", "--help-config"]) == 0
    out = capsys.readouterr().out
    assert "loss.beta" in out and "k3" in out


def test_wrong_key_is_a_one_paragraph_error(tmp_path):
    cfg = tmp_path / "c.yaml"
    cfg.write_text(yaml.safe_dump({"model": {"path": "m"}, "data": {"path": "d"}, "rewards": {"functions": ["length"]}}))
    out = run_cli("train", str(cfg), "loss.betta=0.1")
    assert out.returncode == 2
    assert "unknown config key 'loss.betta'" in out.stderr and "loss.beta" in out.stderr
    assert "Traceback" not in out.stderr


def test_missing_model_folder_error(tmp_path, arithmetic_prompts):
    cfg = tmp_path / "c.yaml"
    cfg.write_text(yaml.safe_dump({"model": {"path": str(tmp_path / "nomodel")}, "data": {"path": str(arithmetic_prompts)},
                                   "rewards": {"functions": ["length"]}, "rollout": {"num_generations": 2},
                                   "run": {"batch_size": 4, "output_dir": str(tmp_path / "out")}}))
    out = run_cli("train", str(cfg))
    assert out.returncode == 2, out.stderr
    assert "does not exist" in out.stderr and "Traceback" not in out.stderr


def test_debug_shows_traceback(tmp_path):
    out = run_cli("--debug", "train", str(tmp_path / "missing.yaml"))
    assert out.returncode == 2 and "Traceback" in out.stderr


def test_a_torchrun_rank_leaves_with_its_code_after_the_exit_handlers():
    """``slimgrpo`` under torchrun ends its ranks with ``os._exit`` (no interpreter teardown, where gloo was
    seen to abort a finished job): the exit code is the command's and ``atexit`` handlers still run."""
    import subprocess
    import sys

    script = ("import atexit, sys\n"
              "atexit.register(lambda: print('handler ran', flush=True))\n"
              "from slimgrpo.commands.cli import _leave_rank\n"
              "print('buffered', end='')\n"
              "_leave_rank(3)\n"
              "print('not reached')\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 3, done.stderr
    assert done.stdout == "bufferedhandler ran\n"
