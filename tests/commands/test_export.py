"""A LoRA run's adapter: merged into its base (plain transformers loads it and gives the same logits as
base + adapter) or saved alone (peft loads it)."""

import copy

import torch
from peft import LoraConfig, PeftModel, get_peft_model
from transformers import AutoModelForCausalLM

from slimgrpo.commands.cli import main


def test_merge_and_adapter_only(tmp_path, tiny_model_dir):
    base = AutoModelForCausalLM.from_pretrained(str(tiny_model_dir))
    peft_model = get_peft_model(copy.deepcopy(base), LoraConfig(r=4, target_modules="all-linear"))
    for n, p in peft_model.named_parameters():
        if "lora_B" in n:
            torch.nn.init.normal_(p, std=0.3)
    adapter = tmp_path / "run" / "final"
    peft_model.save_pretrained(str(adapter))
    assert main(["export", str(tmp_path / "run"), "--out", str(tmp_path / "merged")]) == 0
    assert main(["export", str(tmp_path / "run"), "--out", str(tmp_path / "adapter"), "--adapter-only"]) == 0
    ids = torch.tensor([[5, 9, 17, 3, 8]])
    merged = AutoModelForCausalLM.from_pretrained(str(tmp_path / "merged"))
    reloaded = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(str(tiny_model_dir)),
                                         str(tmp_path / "adapter"))
    with torch.no_grad():
        expected = peft_model(ids).logits
        torch.testing.assert_close(merged(ids).logits, expected, rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(reloaded(ids).logits, expected, rtol=1e-5, atol=1e-5)
        assert not torch.allclose(base(ids).logits, expected)
    assert (tmp_path / "merged" / "tokenizer.json").is_file()


def test_export_refuses_non_empty_target(tmp_path, tiny_model_dir, capsys):
    (tmp_path / "busy").mkdir()
    (tmp_path / "busy" / "x").write_text("keep me")
    assert main(["export", str(tiny_model_dir), "--out", str(tmp_path / "busy")]) == 2
    assert (tmp_path / "busy" / "x").read_text() == "keep me"
