"""The plan counts prompts at the longest the run will see (train/prompts.py), not at data.max_prompt_length:
read as `slimgrpo train` reads them (chat template applied), training and eval.data, capped at the bound,
and the bound kept where the prompts are rendered elsewhere (tools, environments, a rollout function)."""

import dataclasses

import pytest
import yaml

from slimgrpo.commands.cli import main
from slimgrpo.config import load_config
from slimgrpo.modeling import load_tokenizer
from slimgrpo.plan.admission import admit
from slimgrpo.runspec.run import run_spec
from slimgrpo.plan.admission import shape_of
from slimgrpo.plan.model import plan_memory
from slimgrpo.train.prompts import data_prompt_tokens, planned_prompt_tokens, read_prompts
from tests.conftest import write_jsonl

SHORT = [{"prompt": [{"role": "user", "content": f"add {a} and {b}"}], "answer": str(a + b)}
         for a in range(1, 4) for b in range(1, 4)]
LONG_EVAL = [{"prompt": [{"role": "user", "content": "add " + " and ".join(str(i) for i in range(1, 16))}],
              "answer": "120"}]


def _config(tmp_path, model_dir, *overrides, eval_rows=None, validate=True, **data):
    write_jsonl(tmp_path / "train.jsonl", SHORT)
    raw = {"model": {"path": str(model_dir)}, "data": {"path": "train.jsonl", "max_prompt_length": 128, **data},
           "rewards": {"functions": ["length"]}, "rollout": {"num_generations": 2, "max_completion_length": 8},
           "run": {"batch_size": 4, "device": "cpu", "output_dir": str(tmp_path / "run"), "max_steps": 1}}
    if eval_rows is not None:
        write_jsonl(tmp_path / "eval.jsonl", eval_rows)
        raw["eval"] = {"data": "eval.jsonl", "max_prompts": 4, "num_samples": 1}
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(raw))
    return tmp_path / "c.yaml", load_config(str(tmp_path / "c.yaml"), list(overrides), validate=validate)


def _naive_longest(model_dir, rows) -> int:
    """Each prompt through the chat template and the tokenizer, one by one: the longest token count."""
    tok = load_tokenizer(str(model_dir))
    texts = [tok.apply_chat_template(r["prompt"], add_generation_prompt=True, tokenize=False) for r in rows]
    return max(len(tok(t, add_special_tokens=False)["input_ids"]) for t in texts)


def test_the_longest_prompt_is_the_chat_templated_one_of_either_set(tmp_path, tiny_chat_model_dir):
    _, cfg = _config(tmp_path, tiny_chat_model_dir, eval_rows=LONG_EVAL)
    prompts = read_prompts(cfg, load_tokenizer(str(tiny_chat_model_dir)))
    train_longest = _naive_longest(tiny_chat_model_dir, SHORT)
    eval_longest = _naive_longest(tiny_chat_model_dir, LONG_EVAL)
    assert eval_longest > train_longest  # the held-out prompt is the longest: it must count
    assert prompts.longest == eval_longest
    assert planned_prompt_tokens(cfg, prompts) == eval_longest == data_prompt_tokens(cfg)
    _, no_eval = _config(tmp_path, tiny_chat_model_dir)
    assert data_prompt_tokens(no_eval) == train_longest


def test_the_bound_caps_it_and_rendered_prompts_keep_the_bound(tmp_path, tiny_chat_model_dir):
    longest = _naive_longest(tiny_chat_model_dir, SHORT)
    _, cfg = _config(tmp_path, tiny_chat_model_dir, f"data.max_prompt_length={longest - 2}")
    assert data_prompt_tokens(cfg) == longest - 2  # truncated to the bound: never above it
    _, cfg = _config(tmp_path, tiny_chat_model_dir)
    prompts = read_prompts(cfg, load_tokenizer(str(tiny_chat_model_dir)))
    assert planned_prompt_tokens(cfg, prompts, agent_inputs=True) is None  # Python API tools
    for key, value in (("tools", ["x.py:f"]), ("environment", "x.py:Env"), ("rollout_function", "x.py:f")):
        rendered = dataclasses.replace(cfg, rollout=dataclasses.replace(cfg.rollout, **{key: value}))
        assert planned_prompt_tokens(rendered, prompts) is None, key


def test_plan_inputs_take_the_longest_and_the_plan_shrinks_with_it(tmp_path, tiny_chat_model_dir):
    _, cfg = _config(tmp_path, tiny_chat_model_dir)
    shape = shape_of(cfg)
    at_bound = run_spec(cfg, "cpu", vocab=shape.vocab)
    assert at_bound.max_prompt_length == 128
    assert run_spec(cfg, "cpu", vocab=shape.vocab, prompt_tokens=40).max_prompt_length == 40
    assert run_spec(cfg, "cpu", vocab=shape.vocab, prompt_tokens=4000).max_prompt_length == 128
    shorter = plan_memory(shape, run_spec(cfg, "cpu", vocab=shape.vocab, prompt_tokens=40))
    assert shorter.peak_bytes < plan_memory(shape, at_bound).peak_bytes
    # the same plan as a config whose bound is that length (P is the one input that moved)
    same = dataclasses.replace(cfg, data=dataclasses.replace(cfg.data, max_prompt_length=40))
    assert plan_memory(shape, run_spec(same, "cpu", vocab=shape.vocab)).peak_bytes == shorter.peak_bytes


def test_vllm_kv_pool_stays_sized_for_the_configured_context(tmp_path, tiny_chat_model_dir):
    """The engine sizes vLLM's pool from data.max_prompt_length before any prompt (rollout/vllm_engine.py)."""
    _, cfg = _config(tmp_path, tiny_chat_model_dir, "rollout.engine=vllm", validate=False)  # vLLM not needed
    shape = shape_of(cfg)
    kv = [plan_memory(shape, run_spec(cfg, "cpu", vocab=shape.vocab, prompt_tokens=p)).bytes_of("vLLM KV pool")
          for p in (None, 16)]
    assert kv[0] == kv[1] > 0


def test_train_plans_at_the_data_and_says_so(tmp_path, tiny_chat_model_dir, capsys):
    path, _ = _config(tmp_path, tiny_chat_model_dir)
    longest = _naive_longest(tiny_chat_model_dir, SHORT)
    cfg = load_config(str(path), [])
    admission = admit(cfg, show=True, prompt_tokens=data_prompt_tokens(cfg))
    plan = admission.plan
    assert plan.inputs.max_prompt_length == longest
    assert f"prompts counted at {longest} tokens, the longest in data.path" in capsys.readouterr().out
    # the run itself: `slimgrpo train` prints the same line before any weights load
    assert main(["train", str(path)]) == 0
    out = capsys.readouterr().out
    assert f"prompts counted at {longest} tokens" in " ".join(out.split())


def test_plan_command_reads_the_data_unless_told_not_to(tmp_path, tiny_chat_model_dir, capsys):
    path, _ = _config(tmp_path, tiny_chat_model_dir)
    longest = _naive_longest(tiny_chat_model_dir, SHORT)
    assert main(["plan", str(path)]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert f"prompts counted at {longest} tokens" in out and f"(P {longest} + T 8)" in out
    assert main(["plan", str(path), "--no-data"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "prompts counted at data.max_prompt_length=128" in out and "(P 128 + T 8)" in out


def test_plan_command_with_unreadable_data_plans_at_the_bound_and_names_the_file(tmp_path, tiny_chat_model_dir,
                                                                                 capsys):
    path, _ = _config(tmp_path, tiny_chat_model_dir)
    (tmp_path / "train.jsonl").write_text('{"prompt": "fine"}\nnot json\n')
    before = (tmp_path / "train.jsonl").read_bytes()
    assert main(["plan", str(path)]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "could not read the prompts here" in out and "train.jsonl" in out and "(P 128 + T 8)" in out
    assert (tmp_path / "train.jsonl").read_bytes() == before  # the user's file untouched


@pytest.mark.parametrize("generation", [True, False])
def test_trace_takes_the_longest_as_its_prompts(tmp_path, tiny_chat_model_dir, generation):
    from slimgrpo.plan.admission import trace_config

    _, cfg = _config(tmp_path, tiny_chat_model_dir)
    shape = shape_of(cfg)
    same = dataclasses.replace(cfg, data=dataclasses.replace(cfg.data, max_prompt_length=24))
    given = trace_config(cfg, shape, "cpu", generation=generation, prompt_tokens=24)
    assert given.device_peak_bytes == trace_config(same, shape, "cpu", generation=generation).device_peak_bytes
    assert given.device_peak_bytes < trace_config(cfg, shape, "cpu", generation=generation).device_peak_bytes
