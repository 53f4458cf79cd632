"""The full-fine-tuning reference: copied to host memory without a copy where the weights are
(modeling.reference_copy), and run on the device with its layers streamed in one by one
(update/reference.py). On this CPU-only machine the device is the CPU: moves are copies, and the
copies' order and residency are what is checked."""

from __future__ import annotations

import copy

import torch

from slimgrpo.memory.pinned import PAGE

from slimgrpo.runspec.shape import ModelShape
from slimgrpo.modeling import prepare_for_training, reference_copy, reference_placement
from slimgrpo.trace.synthetic import UpdateOnly, random_causal_lm, synthetic_rollout, update_config
from slimgrpo.update.reference import StreamedReference, Transfers, decoder_layers

# Widths that divide no chunk size; untied head (two big tensors outside the layers)
SHAPE = ModelShape(family="qwen2", hidden=40, intermediate=72, layers=3, heads=4, kv_heads=2, vocab=101, tie=False,
                   max_positions=512)


def _model(tie: bool = False):
    shape = ModelShape(**{**SHAPE.__dict__, "tie": tie})
    return random_causal_lm(shape, torch.float32, "cpu", attn_implementation="eager")


def _in_buffer(t: torch.Tensor, buf: torch.Tensor) -> bool:
    start = buf.data_ptr()
    return start <= t.data_ptr() < start + buf.numel()


def test_reference_copy_makes_no_copy_where_the_weights_are(monkeypatch):
    """``deepcopy(model).to("cpu")`` cloned every parameter on its own device first (on a GPU: a second full
    copy there). The new copy never deep-copies a parameter; each one is written once, into the host buffer."""
    cloned = []
    original = torch.nn.Parameter.__deepcopy__

    def spy(self, memo):
        cloned.append(self.numel())
        return original(self, memo)

    monkeypatch.setattr(torch.nn.Parameter, "__deepcopy__", spy)
    model = _model(tie=True)
    cfg = update_config({"loss": {"beta": 0.04}})
    model, ref = prepare_for_training(model, cfg)
    assert ref is not None and cloned == []
    buf = ref.host_buffer.tensor
    tensors = {id(t): t for t in [*model.parameters(), *model.buffers()]}.values()
    exact = sum(-(-t.numel() * t.element_size() // 64) * 64 for t in tensors)  # once each
    assert exact <= buf.numel() < exact + PAGE and buf.data_ptr() % PAGE == 0  # whole pages, to be pinned alone
    for name, p in ref.named_parameters():
        assert _in_buffer(p, buf) and not p.requires_grad, name
        assert p.data_ptr() != dict(model.named_parameters())[name].data_ptr()
    assert ref.lm_head.weight is ref.model.embed_tokens.weight  # still tied
    assert not ref.training


def test_reference_copy_computes_what_deepcopy_computed():
    model = _model()
    old = copy.deepcopy(model).to("cpu").eval().requires_grad_(False)
    new = reference_copy(model, torch.device("cpu"))
    ids = torch.randint(1, SHAPE.vocab, (3, 17), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        want = old(input_ids=ids).logits
        assert torch.equal(new(input_ids=ids).logits, want)
        with StreamedReference(new, torch.device("cpu")) as streamed:
            assert torch.equal(streamed(input_ids=ids).logits, want)


def test_the_host_buffer_is_pinned_once_however_many_streams_run_over_it(monkeypatch):
    """On CUDA a stream page-locks the copy's one host buffer in place before its first copy; a second stream
    over the same copy (the next step's reference pass) must not register it again (cudaHostRegister of
    memory already registered fails). A device copy has no host buffer."""
    from slimgrpo.memory import pinned

    pinned_ptrs = []
    monkeypatch.setattr(pinned, "register_host", lambda t: pinned_ptrs.append(t.data_ptr()))
    model = reference_copy(_model(), torch.device("cpu"))

    class _CudaLike(Transfers):  # the side stream's copies, done as plain copies on this CPU
        def __init__(self):
            super().__init__(torch.device("cpu"))
            self.cuda = True

    for _ in range(2):
        StreamedReference(model, torch.device("cpu"), _CudaLike(), host=model.host_buffer)
    assert pinned_ptrs == [model.host_buffer.tensor.data_ptr()]
    assert model.host_buffer.pinned
    assert reference_copy(_model(), torch.device("meta")).host_buffer is None


class _Recording(Transfers):
    def __init__(self, device):
        super().__init__(device)
        self.copied = 0

    def copy_in(self, host):
        self.copied += host.numel() * host.element_size()
        return super().copy_in(host)


def test_stream_prefetches_the_next_layer_and_holds_two_at_most():
    model = reference_copy(_model(), torch.device("cpu"))
    layers = decoder_layers(model)
    assert len(layers) == SHAPE.layers
    transfers = _Recording(torch.device("cpu"))
    stream = StreamedReference(model, torch.device("cpu"), transfers)
    seen = []
    ids = torch.randint(1, SHAPE.vocab, (2, 9))
    with torch.no_grad(), stream as streamed:
        for i, layer in enumerate(layers):  # what each layer computes with: device copies, not the host tensors
            layer.register_forward_pre_hook(  # runs after the stream's own pre-hook
                lambda m, a, i=i: seen.append((i, not _in_buffer(m.self_attn.q_proj.weight, model.host_buffer.tensor))))
        assert not _in_buffer(model.lm_head.weight, model.host_buffer.tensor)  # the rest is on the device for the pass
        streamed(input_ids=ids)
        streamed(input_ids=ids)  # a second micro-batch: layer 0 was prefetched by the last layer
    assert stream.loads == ["rest", 0, 1, 2, 0, 1, 2, 0]
    assert stream.max_resident_layers == 2
    assert seen == [(i, True) for i in range(3)] * 2
    for name, p in model.named_parameters():  # every weight is the host tensor again
        assert _in_buffer(p, model.host_buffer.tensor), name
    layer_bytes = sum(p.numel() * 4 for p in layers[0].parameters())
    rest_bytes = sum(p.numel() * 4 for p in model.parameters()) - SHAPE.layers * layer_bytes
    buffers = sum(b.numel() * b.element_size() for b in model.buffers())
    assert transfers.copied == rest_bytes + buffers + 7 * layer_bytes


def test_placement_on_cpu_is_host_and_auto_streams_without_a_plan():
    for value in ("auto", "device", "stream", "host"):
        cfg = update_config({"loss": {"beta": 0.04}, "memory": {"reference_placement": value}})
        assert reference_placement(cfg, torch.device("cpu")) == "host"  # host memory is the device
        want = "stream" if value == "auto" else value
        assert reference_placement(cfg, torch.device("cuda")) == want


def test_update_takes_reference_logprobs_through_the_stream(monkeypatch):
    """``Updater.prepare`` runs a "stream" reference through StreamedReference: the same log-probs as the
    host forward."""
    from slimgrpo.update import reference as ref_module

    cfg = update_config({"loss": {"beta": 0.04}, "memory": {"micro_batch_size": 3},
                         "rollout": {"num_generations": 3, "max_completion_length": 11},
                         "data": {"max_prompt_length": 7}})
    runner = UpdateOnly(cfg, _model(), device="cpu")
    rollout = synthetic_rollout(2, 3, 7, 11, vocab=SHAPE.vocab)
    adv = torch.zeros(6)
    host = runner.updater.prepare(rollout, adv).ref_logp
    used = []
    real = ref_module.StreamedReference

    def recording(model, device, transfers=None, host=None):
        used.append(real(model, device, transfers, host))
        return used[-1]

    monkeypatch.setattr(ref_module, "StreamedReference", recording)
    runner.policy.reference_placement = "stream"
    streamed = runner.updater.prepare(rollout, adv).ref_logp
    assert len(used) == 1 and used[0].loads[:2] == ["rest", 0]
    assert torch.equal(streamed, host)


def test_plan_counts_each_placement_and_auto_settles_against_the_budget():
    import dataclasses

    from slimgrpo.plan.admission import PlanScope, settle_reference_placement
    from slimgrpo.runspec.run import RunSpec
    from slimgrpo.plan.model import plan_memory
    from slimgrpo.runspec.shape import load_shape

    shape = load_shape("qwen2.5-0.5b")
    base = RunSpec(device="cuda", beta=0.04, max_completion_length=256)
    host, stream, device = (plan_memory(shape, dataclasses.replace(base, reference_placement=p))
                            for p in ("host", "stream", "device"))
    weights = shape.num_params * 2
    assert host.host_bytes == stream.host_bytes == weights and device.host_bytes == 0
    assert device.peak_bytes == host.peak_bytes + weights  # the copy on the GPU, always
    working = (shape.num_params - shape.layers * shape.layer_params + 2 * shape.layer_params) * 2
    update = sum(c.bytes for c in host.components if c.phase == "update" and c.location == "device")
    assert stream.bytes_of("reference stream") == max(0, working - update)  # hidden under the update when smaller
    assert stream.peak_bytes == host.peak_bytes + stream.bytes_of("reference stream")

    def settled(budget):
        cfg = update_config({"loss": {"beta": 0.04}, "memory": {"budget": budget},
                             "rollout": {"max_completion_length": 256}})
        return settle_reference_placement(cfg, PlanScope(shape, "cuda")).memory.reference_placement

    assert settled("200GiB") == "device"
    assert settled(f"{(device.peak_bytes - 1) / 2**30:.6f}GiB") == "stream"  # the copy would not fit
    cfg = update_config({"loss": {"beta": 0.04}, "lora": {"enabled": True}})
    assert settle_reference_placement(cfg, PlanScope(shape, "cuda")).memory.reference_placement == "auto"  # no copy: untouched


def test_trace_counts_a_device_reference_on_the_device():
    """``plan --trace`` / ``memory.fit=trace`` with ``reference_placement=device``: the copy is device memory,
    as the plan's line is; with the default it stays in the host account."""
    from slimgrpo.config import from_dict, merge_overrides
    from slimgrpo.runspec.run import run_spec
    from slimgrpo.plan.model import plan_memory
    from slimgrpo.plan.admission import trace_config

    shape = ModelShape("llama", hidden=64, intermediate=96, layers=2, heads=4, kv_heads=2, vocab=300, tie=False,
                       max_positions=4096)
    base = ["model.dtype=bfloat16", "run.device=cuda", "loss.beta=0.04", "rollout.num_generations=2",
            "run.batch_size=2", "data.max_prompt_length=16", "rollout.max_completion_length=32"]
    ref_bytes = shape.num_params * 2
    for placement in ("host", "device"):
        cfg = from_dict(merge_overrides({}, base + [f"memory.reference_placement={placement}"]))
        plan = plan_memory(shape, run_spec(cfg, "cuda", vocab=shape.vocab))
        trace = trace_config(cfg, shape, device="cuda", generation=False)
        on_device = trace.phases["update"].by_tag.get("reference policy", 0)
        # (the trace also counts the rotary tables' few bytes)
        if placement == "device":
            assert plan.host_bytes == 0 and 0 <= on_device - ref_bytes < 1024 and trace.host_peak_bytes == 0
        else:
            assert plan.host_bytes == ref_bytes and 0 <= trace.host_peak_bytes - ref_bytes < 1024 and on_device == 0
