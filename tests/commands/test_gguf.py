"""GGUF files as ``model.path``: a tiny Llama written as GGUF in the test (the ``gguf`` package writes it),
read back through transformers with the tokenizer from the same file, equal to the model it was made from."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

pytest.importorskip("gguf")

from conftest import build_tokenizer  # noqa: E402
from slimgrpo.model_gguf import GGUFError, convert_gguf, gguf_config, is_gguf  # noqa: E402

HEADS, KV_HEADS, HIDDEN, LAYERS = 4, 2, 32, 2
TEMPLATE = ("{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}\n{% endfor %}"
            "{% if add_generation_prompt %}<assistant>{% endif %}")


def _permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """llama.cpp's q/k row order (interleaved rotary halves); transformers undoes it on load."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def write_tiny_gguf(path: Path, tokenizer_dir: Path, seed: int = 0):
    """A random 2-layer Llama and the test tokenizer as a GGUF file; returns the Hugging Face model."""
    import gguf
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    tok = PreTrainedTokenizerFast.from_pretrained(str(tokenizer_dir))
    vocab = tok.backend_tokenizer.to_str()
    model_json = json.loads(vocab)["model"]
    tokens = [t for t, _ in sorted(model_json["vocab"].items(), key=lambda kv: kv[1])]
    merges = [m if isinstance(m, str) else " ".join(m) for m in model_json["merges"]]
    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=len(tokens), hidden_size=HIDDEN, intermediate_size=2 * HIDDEN,
                      num_hidden_layers=LAYERS, num_attention_heads=HEADS, num_key_value_heads=KV_HEADS,
                      max_position_embeddings=256, rms_norm_eps=1e-5, rope_theta=10000.0, tie_word_embeddings=True,
                      bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    hf = LlamaForCausalLM(cfg).eval()
    for p in hf.model.norm.parameters():  # non-trivial norms, so a mix-up of norm tensors would show
        p.data.uniform_(0.5, 1.5)

    w = gguf.GGUFWriter(str(path), arch="llama")
    w.add_name("tiny-llama")
    w.add_context_length(256)
    w.add_embedding_length(HIDDEN)
    w.add_block_count(LAYERS)
    w.add_feed_forward_length(2 * HIDDEN)
    w.add_head_count(HEADS)
    w.add_head_count_kv(KV_HEADS)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_freq_base(10000.0)
    w.add_vocab_size(len(tokens))
    w.add_tokenizer_model("gpt2")
    w.add_token_list(tokens)
    w.add_token_types([3 if t in tok.all_special_tokens else 1 for t in tokens])
    w.add_token_merges(merges)
    w.add_bos_token_id(tok.bos_token_id)
    w.add_eos_token_id(tok.eos_token_id)
    w.add_pad_token_id(tok.pad_token_id)
    w.add_chat_template(TEMPLATE)
    sd = {k: v.detach().float().numpy() for k, v in hf.state_dict().items()}
    w.add_tensor("token_embd.weight", sd["model.embed_tokens.weight"])
    w.add_tensor("output_norm.weight", sd["model.norm.weight"])
    names = {"input_layernorm": "attn_norm", "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k",
             "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output", "post_attention_layernorm": "ffn_norm",
             "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down"}
    for i in range(LAYERS):
        for hf_name, g_name in names.items():
            t = sd[f"model.layers.{i}.{hf_name}.weight"]
            if g_name == "attn_q":
                t = _permute(t, HEADS)
            elif g_name == "attn_k":
                t = _permute(t, KV_HEADS)
            w.add_tensor(f"blk.{i}.{g_name}.weight", np.ascontiguousarray(t))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return hf, tok


@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory):
    path = tmp_path_factory.mktemp("gguf") / "tiny.gguf"
    tok_dir = tmp_path_factory.mktemp("gguf_tok")
    build_tokenizer(tok_dir)
    hf, tok = write_tiny_gguf(path, tok_dir)
    return path, hf, tok


def test_gguf_config_and_shape(tiny_gguf):
    from slimgrpo.runspec.shape import load_shape

    path, hf, _ = tiny_gguf
    assert is_gguf(path) and not is_gguf(path.parent)
    cfg = gguf_config(path)
    assert (cfg["model_type"], cfg["num_hidden_layers"], cfg["hidden_size"]) == ("llama", LAYERS, HIDDEN)
    assert (cfg["num_attention_heads"], cfg["num_key_value_heads"]) == (HEADS, KV_HEADS)
    shape = load_shape(str(path))
    assert shape.layers == LAYERS and shape.hidden == HIDDEN and shape.vocab == hf.config.vocab_size


def test_model_path_gguf_loads_the_same_model_and_tokenizer(tiny_gguf):
    from slimgrpo.config import ModelConfig
    from slimgrpo.modeling import load_model, load_tokenizer, read_model_config

    path, hf, tok = tiny_gguf
    assert read_model_config(str(path))["num_hidden_layers"] == LAYERS
    model = load_model(ModelConfig(path=str(path)), torch.device("cpu"), torch.float32).eval()
    ids = torch.tensor([tok("What is 12 plus 30? The answer is 42.")["input_ids"]])
    with torch.no_grad():
        torch.testing.assert_close(model(ids).logits, hf(ids).logits, rtol=1e-4, atol=1e-4)
    gtok = load_tokenizer(str(path))
    text = "Tom has 3 apples #### 8"
    assert gtok(text)["input_ids"] == tok(text)["input_ids"]
    assert gtok.eos_token_id == tok.eos_token_id and gtok.padding_side == "left"
    # Each special token by the file's own id (transformers 5.17's Llama converter took EOS from BOS's id)
    assert (gtok.bos_token_id, gtok.pad_token_id) == (tok.bos_token_id, tok.pad_token_id) != (tok.eos_token_id,) * 2
    assert "<assistant>" in gtok.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False,
                                                     add_generation_prompt=True)


def test_convert_gguf_writes_a_folder_and_never_overwrites(tiny_gguf, tmp_path):
    from transformers import AutoModelForCausalLM

    path, hf, tok = tiny_gguf
    out = convert_gguf(path, tmp_path / "hf")
    assert (out / "model.safetensors").is_file() and (out / "tokenizer.json").is_file()
    again = AutoModelForCausalLM.from_pretrained(str(out), dtype=torch.float32).eval()
    ids = torch.tensor([tok("The quick brown fox")["input_ids"]])
    with torch.no_grad():
        torch.testing.assert_close(again(ids).logits, hf(ids).logits, rtol=1e-4, atol=1e-4)
    (tmp_path / "busy").mkdir()
    (tmp_path / "busy" / "mine.txt").write_text("keep")
    with pytest.raises(GGUFError, match="not empty"):
        convert_gguf(path, tmp_path / "busy")
    assert (tmp_path / "busy" / "mine.txt").read_text() == "keep"


def test_missing_gguf_file_and_package_are_named(tmp_path, monkeypatch):
    from slimgrpo import model_gguf
    from slimgrpo.modeling import ModelLoadError, read_model_config

    with pytest.raises(ModelLoadError, match="does not exist"):
        read_model_config(str(tmp_path / "nope.gguf"))
    f = tmp_path / "m.gguf"
    f.write_bytes(b"GGUF")
    monkeypatch.setattr(model_gguf.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(ModelLoadError, match="pip install gguf"):
        read_model_config(str(f))


@pytest.mark.parametrize("keep", [24, 0.5])
def test_a_gguf_file_cut_short_is_bad_input_naming_the_file(tiny_gguf, tmp_path, capsys, keep):
    """A download cut short: exit 2 naming the file as damaged, in plan, eval and train (was 'internal error:
    unpack_from requires a buffer of at least 24 bytes', exit 1)."""
    from slimgrpo.commands.cli import main
    from slimgrpo.demo import EVAL_FILE

    path, _, _ = tiny_gguf
    data = path.read_bytes()
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(data[: keep if isinstance(keep, int) else int(len(data) * keep)])
    runs = [["plan", "--model", str(cut)],
            ["eval", "--model", str(cut), "--data", str(EVAL_FILE), "--rewards", "length", "--limit", "1"],
            ["train", f"model.path={cut}", f"data.path={EVAL_FILE}", "rewards.functions=[length]",
             f"run.output_dir={tmp_path / 'run'}", "run.max_steps=1", "rollout.num_generations=2",
             "run.batch_size=2"]]
    for argv in runs:
        assert main(argv) == 2, argv
        err = capsys.readouterr().err
        assert str(cut) in err and "damaged" in err and "internal error" not in err, (argv, err)
