"""Static-cache decode (rollout/cuda_graph.py): the logic on CPU (graphs off) against the dynamic path."""

from __future__ import annotations

import contextlib

import pytest
import torch

from slimgrpo.rollout import SamplingParams, TorchRolloutEngine
from slimgrpo.rollout import engine as engine_mod
from slimgrpo.rollout.cuda_graph import ENV, StaticCacheStepper, enabled
from slimgrpo.rollout.decode import LlamaStepper

from test_rollout import PROMPTS, hf_greedy, padded, tiny_model  # noqa: E402


@pytest.fixture
def static_stepper(monkeypatch):
    """Make the engine decode with StaticCacheStepper (graphs off: the CPU path of the same logic)."""
    made = []

    def make(parts, cache, prompt_mask, max_new, lean, kv_cache_dtype=None, graphs=None):
        made.append(StaticCacheStepper(parts, cache, prompt_mask, max_new, graphs=False))
        return made[-1]

    monkeypatch.setattr(engine_mod, "make_stepper", make)
    return made


def greedy(max_new, eos=()):
    return SamplingParams(max_new_tokens=max_new, temperature=0.0, eos_token_ids=eos, pad_token_id=0)


@pytest.mark.parametrize("arch", ["qwen2", "llama", "qwen3", "mistral"])
def test_static_cache_greedy_equals_dynamic_and_hf(arch, static_stepper):
    model = tiny_model(arch=arch)
    ro = TorchRolloutEngine(model).generate(PROMPTS, 2, greedy(12))
    assert static_stepper and static_stepper[0].t == 11  # the static stepper really decoded
    assert torch.equal(ro.completion_ids, hf_greedy(model, PROMPTS, 12, eos=()).repeat_interleave(2, dim=0))


def test_static_cache_with_dropped_rows(static_stepper):
    """Rows that end early leave the batch (select); the rest continue as with the dynamic stepper."""
    model = tiny_model(arch="llama")
    free = hf_greedy(model, PROMPTS, 12, eos=())
    eos = (int(free[0, 2]), int(free[2, 5]))
    ro = TorchRolloutEngine(model, drop_finished_fraction=0.0).generate(PROMPTS, 2, greedy(12, eos))
    expected = hf_greedy(model, PROMPTS, 12, eos=eos).repeat_interleave(2, dim=0)
    assert torch.equal(ro.completion_ids, padded(expected, ro.completion_ids.shape[1]))
    assert ro.completion_lengths.min() < 12  # some rows ended early


def test_static_step_hidden_matches_lean_step():
    from transformers import DynamicCache

    from slimgrpo.rollout.model_parts import CausalLMParts

    model = tiny_model(arch="qwen2")
    parts = CausalLMParts(model)
    ids = torch.tensor([[0, 0, 5, 6, 7], [8, 9, 10, 11, 12]])
    mask = ids.ne(0) | torch.tensor([[False] * 5, [True] * 5])
    hidden = []
    for cls in (LlamaStepper, StaticCacheStepper):
        cache = DynamicCache(config=parts.config)
        with torch.no_grad():
            parts.decoder(input_ids=ids, attention_mask=mask.long(), position_ids=(mask.long().cumsum(-1) - 1).clamp(min=0),
                          past_key_values=cache, use_cache=True)
            stepper = cls(parts, cache, mask, 6)
            if cls is StaticCacheStepper:  # attention reads unwritten columns: they must be finite (zeros)
                assert all(bool(b[:, :, 5:].eq(0).all()) for b in (*stepper.slot.keys, *stepper.slot.values))
            hidden.append(torch.stack([stepper.step(torch.tensor([3 + t, 40 + t])) for t in range(6)]))
    torch.testing.assert_close(hidden[1], hidden[0], rtol=1e-5, atol=1e-5)


def test_enabled_only_on_cuda_and_opt_in(monkeypatch):
    monkeypatch.setenv(ENV, "1")
    assert enabled(torch.device("cuda")) and not enabled(torch.device("cpu"))
    monkeypatch.setenv(ENV, "0")
    assert not enabled(torch.device("cuda"))


def test_graphs_refused_on_cpu():
    from transformers import DynamicCache

    from slimgrpo.rollout.model_parts import CausalLMParts

    parts = CausalLMParts(tiny_model())
    cache = DynamicCache(config=parts.config)
    ids = torch.tensor([[5, 6]])
    with torch.no_grad():
        parts.decoder(input_ids=ids, past_key_values=cache, use_cache=True)
    with pytest.raises(ValueError, match="CUDA"):
        StaticCacheStepper(parts, cache, torch.ones_like(ids, dtype=torch.bool), 4, graphs=True)


# --------------------------------------------------------------------------- the graph cache
# torch.cuda.CUDAGraph cannot run on CPU: the cache records through a backend, and these tests pass a stand-in
# that counts what would be recorded and replays by calling the step, so everything around the recording
# (keys, buckets, padding, rows leaving, reuse across calls, invalidation) runs here.

from peft import LoraConfig, get_peft_model  # noqa: E402
from torch import nn  # noqa: E402

from slimgrpo.rollout import graph_cache  # noqa: E402
from slimgrpo.rollout.graph_cache import GraphCache, batch_bucket, length_bucket  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")


class StandInGraph:
    def __init__(self, fn, backend):
        self.fn, self.backend = fn, backend

    def replay(self):
        self.backend.replays += 1
        self.fn()


class StandInGraphs:
    """Counts captures; a 'graph' replays by calling the recorded step (CUDA semantics: recording does not run it)."""

    def __init__(self, fail: bool = False):
        self.captures = self.runs = self.replays = 0
        self.fail = fail

    def run(self, fn):
        self.runs += 1
        fn()

    def capture(self, fn):
        if self.fail:
            raise RuntimeError("operation not permitted when stream is capturing")
        self.captures += 1
        return StandInGraph(fn, self)


def graph_engine(model, backend=None, max_graphs=32, **kw):
    engine = TorchRolloutEngine(model, pack_weights="none", **kw)
    engine.graph_cache = GraphCache(backend if backend is not None else StandInGraphs(), max_graphs=max_graphs)
    return engine


def eos_params(model, max_new=12):
    """Greedy with EOS ids chosen from a free run so that rows end at different steps (rows leave the batch)."""
    free = hf_greedy(model, PROMPTS, max_new, eos=())
    return greedy(max_new, (int(free[0, 2]), int(free[2, 5]), int(free[3, 1])))


def test_buckets():
    assert [batch_bucket(r) for r in (1, 2, 3, 4, 5, 8, 9, 16, 17)] == [1, 2, 4, 4, 8, 8, 16, 16, 24]
    assert length_bucket(1) == length_bucket(256) == 256 and length_bucket(257) == 512


def test_graphs_are_kept_across_calls_and_dropped_rows():
    """A second generate records nothing new; the tokens equal the eager lean path's, padded rows and all."""
    model = tiny_model(arch="llama")
    params = eos_params(model)
    eager = TorchRolloutEngine(model, drop_finished_fraction=0.0).generate(PROMPTS, 2, params)
    assert eager.completion_lengths.min() < 12  # some rows end early: the batch shrinks
    engine = graph_engine(model, drop_finished_fraction=0.0)
    backend = engine.graph_cache.backend
    first = engine.generate(PROMPTS, 2, params)
    assert torch.equal(first.completion_ids, eager.completion_ids)
    assert torch.equal(first.completion_lengths, eager.completion_lengths)
    recorded = backend.captures
    assert recorded >= 2  # 8 rows, then a smaller bucket once enough rows ended
    assert backend.runs == recorded  # each recording ran its step once (the warm-up), nothing ran twice
    replays = backend.replays
    second = engine.generate(PROMPTS, 2, params)
    assert torch.equal(second.completion_ids, eager.completion_ids)
    assert backend.captures == recorded and backend.replays > replays  # nothing recorded again: replays only
    assert engine.graph_cache.captures == recorded and engine.graph_cache.invalidations == 0


def test_rows_leaving_within_a_bucket_record_nothing():
    """8 rows -> 6: the same padded size, so the rows stay (fed padding) and the 8-row graph goes on."""
    model = tiny_model(arch="llama")
    free = hf_greedy(model, PROMPTS, 12, eos=())
    params = greedy(12, (int(free[0, 2]),))  # one prompt's two rows end
    engine = graph_engine(model, drop_finished_fraction=0.0)
    ro = engine.generate(PROMPTS, 2, params)
    eager = TorchRolloutEngine(model, drop_finished_fraction=0.0).generate(PROMPTS, 2, params)
    assert torch.equal(ro.completion_ids, eager.completion_ids)
    assert (ro.completion_lengths < 12).sum() == 2
    assert engine.graph_cache.backend.captures == 1 and engine.graph_cache.keys() == [(8, 256)]


def test_padded_batch_and_bound_on_graphs():
    """3 rows run in the 4-row graph; with max_graphs=1 a shrinking batch stays padded in the graph held."""
    model = tiny_model(arch="qwen3")
    params = eos_params(model)
    prompts = PROMPTS[:3]
    eager = TorchRolloutEngine(model, drop_finished_fraction=0.0).generate(prompts, 1, params)
    one = graph_engine(model, max_graphs=1, drop_finished_fraction=0.0)
    ro = one.generate(prompts, 1, params)
    assert torch.equal(ro.completion_ids, eager.completion_ids)
    assert one.graph_cache.keys() == [(4, 256)] and one.graph_cache.backend.captures == 1
    many = graph_engine(model, drop_finished_fraction=0.0)
    assert torch.equal(many.generate(prompts, 1, params).completion_ids, eager.completion_ids)
    assert len(many.graph_cache.keys()) > 1  # it did record the smaller buckets


def test_in_place_update_is_seen_and_a_replaced_weight_records_again():
    model = tiny_model(arch="llama")
    params = greedy(10, ())
    engine = graph_engine(model)
    engine.generate(PROMPTS, 1, params)
    cache, backend = engine.graph_cache, engine.graph_cache.backend
    assert backend.captures == 1
    with torch.no_grad():  # an optimizer step: in place, same addresses
        for p in model.model.layers[0].parameters():
            p.mul_(1.5)
    ro = engine.generate(PROMPTS, 1, params)
    assert backend.captures == 1 and cache.invalidations == 0
    assert torch.equal(ro.completion_ids, TorchRolloutEngine(model).generate(PROMPTS, 1, params).completion_ids)
    layer = model.model.layers[1].mlp.up_proj
    layer.weight = nn.Parameter(layer.weight.detach() * -1.0)  # a new tensor: the graph's address is stale
    ro = engine.generate(PROMPTS, 1, params)
    assert backend.captures == 2 and cache.invalidations == 1
    assert torch.equal(ro.completion_ids, TorchRolloutEngine(model).generate(PROMPTS, 1, params).completion_ids)


class FourBitLinear(nn.Linear):
    """A deterministic QLoRA base stand-in: 16-level codes (one per byte) and one absmax per 64 weights,
    dequantised in every forward (what bitsandbytes' 4-bit layer computes, not how it stores it)."""

    LEVELS = torch.linspace(-1.0, 1.0, 16)

    def __init__(self, linear: nn.Linear) -> None:
        nn.Module.__init__(self)
        self.in_features, self.out_features = linear.in_features, linear.out_features
        w = linear.weight.detach().float().reshape(-1, 64)
        absmax = w.abs().amax(-1, keepdim=True).clamp(min=1e-8)
        codes = ((w / absmax)[..., None] - self.LEVELS).abs().argmin(-1).to(torch.uint8)
        self.weight = nn.Parameter(codes.reshape(-1), requires_grad=False)
        self.register_buffer("absmax", absmax.squeeze(-1).to(linear.weight.dtype))
        self.register_buffer("levels", self.LEVELS.to(linear.weight.dtype))
        self.bias = None

    def forward(self, x):
        w = (self.levels[self.weight.long()].view(-1, 64) * self.absmax[:, None]).view(self.out_features, -1)
        return x @ w.t().to(x.dtype)


def lora_model(quantised: bool):
    model = tiny_model(arch="llama")
    if quantised:
        for layer in model.model.layers:
            for parent in (layer.self_attn, layer.mlp):
                for name, child in list(parent.named_children()):
                    if type(child) is nn.Linear:
                        setattr(parent, name, FourBitLinear(child))
    lora = get_peft_model(model, LoraConfig(r=4, target_modules=["q_proj", "v_proj", "up_proj", "down_proj"],
                                            lora_dropout=0.0))
    torch.manual_seed(1)
    with torch.no_grad():  # peft starts B at zero: give the adapters an effect
        for name, p in lora.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.2)
    return lora.eval()


@pytest.mark.parametrize("quantised", [False, True], ids=["lora", "qlora"])
def test_greedy_equal_with_and_without_graphs_on_adapters(quantised):
    """LoRA (peft) and a 4-bit base with LoRA: the eager lean path, the static stepper without graphs and the
    recorded one give the same greedy tokens, rows leaving on EOS."""
    model = lora_model(quantised)
    base = model.get_base_model()
    free = TorchRolloutEngine(model).generate(PROMPTS, 1, greedy(12, ())).completion_ids
    params = greedy(12, (int(free[0, 3]), int(free[2, 6])))
    eager = TorchRolloutEngine(model, drop_finished_fraction=0.0).generate(PROMPTS, 2, params)
    static = TorchRolloutEngine(model, drop_finished_fraction=0.0, pack_weights="none")
    static.graph_cache = GraphCache(None)  # the static stepper, run eagerly (bucketed, padded)
    graphed = graph_engine(model, drop_finished_fraction=0.0)
    assert torch.equal(static.generate(PROMPTS, 2, params).completion_ids, eager.completion_ids)
    for _ in range(2):
        assert torch.equal(graphed.generate(PROMPTS, 2, params).completion_ids, eager.completion_ids)
    backend = graphed.graph_cache.backend
    assert backend.captures >= 1 and backend.replays > 0
    recorded = backend.captures
    model.base_model.disable_adapter_layers()  # peft's forward takes another branch: the graphs are stale
    try:
        off = graphed.generate(PROMPTS, 2, params).completion_ids
        assert backend.captures > recorded
        assert torch.equal(off, TorchRolloutEngine(base, drop_finished_fraction=0.0).generate(
            PROMPTS, 2, params).completion_ids)
    finally:
        model.base_model.enable_adapter_layers()


def test_call_packed_weights_are_not_recorded():
    """CPU packing makes weights for one call: a graph would keep their freed addresses, so none is recorded."""
    model = tiny_model(arch="llama")
    engine = TorchRolloutEngine(model, pack_weights="all")
    engine.graph_cache = GraphCache(StandInGraphs())
    ro = engine.generate(PROMPTS, 1, greedy(8, ()))
    assert engine.graph_cache.backend.captures == 0
    assert torch.equal(ro.completion_ids, TorchRolloutEngine(model).generate(PROMPTS, 1, greedy(8, ())).completion_ids)


def test_a_step_that_cannot_be_recorded_runs_eagerly():
    model = tiny_model(arch="llama")
    engine = graph_engine(model, backend=StandInGraphs(fail=True))
    with pytest.warns(RuntimeWarning, match="could not be recorded"):
        ro = engine.generate(PROMPTS, 2, greedy(8, ()))
    assert engine.graph_cache.failure and engine.graph_cache.backend is None
    assert torch.equal(ro.completion_ids, TorchRolloutEngine(model).generate(PROMPTS, 2, greedy(8, ())).completion_ids)


def test_cuda_backend_never_empties_the_allocator(monkeypatch):
    """The CUDA backend records with capture_begin/capture_end into one shared pool on a side stream; it
    never synchronises the device or empties the caching allocators (``torch.cuda.graph`` does both)."""
    calls = []

    class FakeStream:
        def __init__(self, device=None):
            pass

        def wait_stream(self, other):
            calls.append("wait")

    class FakeGraph:
        def capture_begin(self, pool=None, **kw):
            calls.append(("begin", pool))

        def capture_end(self):
            calls.append("end")

    @contextlib.contextmanager
    def on_stream(stream):
        calls.append("stream")
        yield

    def forbidden(*a, **k):
        raise AssertionError("emptied the allocator / synchronised")

    monkeypatch.setattr(torch.cuda, "Stream", FakeStream)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: FakeStream())
    monkeypatch.setattr(torch.cuda, "stream", on_stream)
    monkeypatch.setattr(torch.cuda, "CUDAGraph", FakeGraph)
    monkeypatch.setattr(torch.cuda, "graph_pool_handle", lambda: "pool-0")
    for name in ("empty_cache", "synchronize", "graph"):
        monkeypatch.setattr(torch.cuda, name, forbidden)
    monkeypatch.setattr(torch._C, "_host_emptyCache", forbidden, raising=False)
    backend = graph_cache.CudaGraphBackend(torch.device("cuda"))
    ran = []
    backend.run(lambda: ran.append(1))
    graphs = [backend.capture(lambda: ran.append(2)) for _ in range(2)]
    assert ran == [1, 2, 2]  # the fake records by running; the real one does not
    assert all(isinstance(g, FakeGraph) for g in graphs)
    assert calls.count(("begin", "pool-0")) == 2 and calls.count("end") == 2  # one shared pool


def test_static_step_never_waits_for_the_device():
    """A recorded step may not synchronise: count host syncs inside the step (the stand-in replays the
    real step), and the loop's, over a call whose rows leave on EOS."""
    from test_rollout import counted_host_syncs

    model = tiny_model(arch="llama")
    engine = graph_engine(model, drop_finished_fraction=0.0)
    params = eos_params(model)
    engine.generate(PROMPTS, 2, params)  # recordings happen here
    with counted_host_syncs(engine) as counts:
        ro = engine.generate(PROMPTS, 2, params)
    assert counts["step"] == 0 and 0 < counts["loop"] < int(ro.completion_lengths.max())


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("lora", [False, True])
def test_real_graphs_kept_across_calls_see_in_place_updates(lora):
    """CUDA: graphs recorded in the first call are replayed in the next (nothing recorded), an in-place weight
    update is read by the replay (tokens equal the eager path's on the updated model), a replaced weight
    records again."""
    from slimgrpo.rollout.cuda_graph import cuda_graph_cache

    model = tiny_model(arch="llama").cuda()
    if lora:
        model = get_peft_model(model, LoraConfig(r=4, target_modules=["q_proj", "v_proj", "up_proj"])).eval()
        with torch.no_grad():
            for name, p in model.named_parameters():
                if "lora_B" in name:
                    p.normal_(0, 0.2)
    base = model.get_base_model() if lora else model
    prompts = PROMPTS
    free = TorchRolloutEngine(model).generate(prompts, 1, greedy(16, ())).completion_ids.cpu()
    params = greedy(16, (int(free[0, 3]), int(free[2, 9])))

    def eager():
        return TorchRolloutEngine(model, drop_finished_fraction=0.0).generate(prompts, 2, params).completion_ids

    engine = TorchRolloutEngine(model, drop_finished_fraction=0.0)
    engine.graph_cache = cache = cuda_graph_cache(torch.device("cuda", torch.cuda.current_device()))
    assert torch.equal(engine.generate(prompts, 2, params).completion_ids, eager())
    recorded = cache.captures
    assert recorded >= 1
    assert torch.equal(engine.generate(prompts, 2, params).completion_ids, eager())
    assert cache.captures == recorded
    with torch.no_grad():
        for p in base.model.layers[0].parameters():
            p.mul_(1.3)
    assert torch.equal(engine.generate(prompts, 2, params).completion_ids, eager())
    assert cache.captures == recorded and cache.invalidations == 0
    layer = base.model.layers[1].mlp.down_proj
    layer.weight = nn.Parameter(layer.weight.detach() * -1.0)
    assert torch.equal(engine.generate(prompts, 2, params).completion_ids, eager())
    assert cache.captures > recorded and cache.invalidations == 1


def test_graph_capture_keeps_to_its_own_thread(monkeypatch):
    """Captures use CUDA's thread-local error mode: a CUDA call from another thread while a step is recorded (a
    reward model's worker, NCCL's watchdog) must not spoil the capture, as it does in the default global mode.
    The CUDA runtime is stubbed: what is checked is how the capture is begun."""
    import contextlib

    from slimgrpo.rollout import graph_cache

    begun = []

    class Graph:
        def capture_begin(self, pool=None, capture_error_mode="global"):
            begun.append(capture_error_mode)

        def capture_end(self):
            pass

    class Stream:
        def __init__(self, device=None):
            pass

        def wait_stream(self, other):
            pass

    monkeypatch.setattr(torch.cuda, "Stream", Stream)
    monkeypatch.setattr(torch.cuda, "graph_pool_handle", lambda: object())
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: Stream())
    monkeypatch.setattr(torch.cuda, "stream", lambda s: contextlib.nullcontext())
    monkeypatch.setattr(torch.cuda, "CUDAGraph", Graph)
    graph_cache.CudaGraphBackend(torch.device("cuda", 0)).capture(lambda: None)
    assert begun == ["thread_local"]


def test_the_plan_holds_the_graphs_kv_arena_through_the_update(monkeypatch):
    """With CUDA graphs on, the KV arena stays allocated from one generate call to the next, through the update:
    the plan's KV line is then always held, sized as the arena is (rows and length rounded up to the graphs'
    buckets), and the update's peak carries it."""
    from slimgrpo.config import from_dict, merge_overrides
    from slimgrpo.plan.model import plan_memory
    from slimgrpo.rollout.graph_cache import LENGTH_BUCKET, batch_bucket
    from slimgrpo.runspec.cost import kv_cache_bytes
    from slimgrpo.runspec.run import run_spec
    from slimgrpo.runspec.shape import load_shape

    shape = load_shape("qwen2.5-0.5b")
    cfg = from_dict(merge_overrides({}, ["run.device=cuda", "lora.enabled=true", "run.batch_size=6",
                                         "rollout.num_generations=6", "data.max_prompt_length=100",
                                         "rollout.max_completion_length=300"]))
    monkeypatch.delenv("SLIMGRPO_CUDA_GRAPHS", raising=False)
    plain = plan_memory(shape, run_spec(cfg, "cuda", vocab=shape.vocab))
    monkeypatch.setenv("SLIMGRPO_CUDA_GRAPHS", "1")
    spec = run_spec(cfg, "cuda", vocab=shape.vocab)
    graphs = plan_memory(shape, spec)
    assert spec.cuda_graphs and not run_spec(cfg, "cpu", vocab=shape.vocab).cuda_graphs
    line = next(c for c in graphs.components if c.name == "KV cache")
    arena = kv_cache_bytes(shape.layers, 512, shape.kv_heads, shape.head_dim, batch_bucket(6), 2)
    assert (line.phase, line.bytes) == ("always", arena) and batch_bucket(6) == 8 and LENGTH_BUCKET == 256
    assert next(c for c in plain.components if c.name == "KV cache").phase == "generation"
    assert graphs.phase_total("always") - plain.phase_total("always") == arena
