"""The resolved run spec: one step of a run described by the numbers its memory depends on, built once from the
config (``run_spec``) and read by the planner, the trace, the rollout engine's builder and the update.

    spec = run_spec(cfg, device="cuda", world_size=1, vocab=shape.vocab, prompt_tokens=153)
    spec.micro_rows, spec.seq_len, spec.fused_loss, spec.compute_bytes

Field names match the config keys they come from. What the config leaves to the run (``memory.tiled_mlp=auto``,
the decode packing of CPU float32 weights) stays ``"auto"`` here until the planner's admission of the run
resolves it (``slimgrpo.plan.admission``): a run then reads the resolved spec, so the choice a plan counted is
the choice the run makes. Rules that both the planner and the run follow are decided here once: the fused head
+ loss path (``fused_loss``), the reference's and old log-probs' need (``needs_reference``).
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from slimgrpo.config import Config, auto_token_chunk
from slimgrpo.config.sections.loss import takes_fused_path
from slimgrpo.config.sections.memory import bf16_update_rule
from slimgrpo.config.sections.rollout import resolve_engine
from slimgrpo.runspec.cost import LORA_MODULES, QLORA_COMPUTE_BYTES

if TYPE_CHECKING:
    from slimgrpo.plan.types import MemoryPlan

@dataclass(frozen=True)
class RunSpec:
    """Everything the plan depends on besides the model shape (field names match the config)."""

    device: str = "cuda"
    """Where training runs: "cuda" (device peak = GPU memory) or "cpu" (peak = process RSS)."""
    param_dtype_bytes: int = 2
    """Bytes per weight as loaded: 2 for bf16/fp16, 4 for fp32. Parameters stay in this dtype (a float32
    master copy beside them only by ``bf16_update``); it is also the activation dtype unless the base is 4-bit."""
    lora: bool = False
    """Train LoRA adapters on a frozen base instead of all weights."""
    lora_rank: int = 16
    """LoRA rank r: each adapted projection gains r·(in + out) trainable parameters."""
    lora_target_modules: tuple[str, ...] = ("all-linear",)
    """Projections that get adapters: names from q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj,
    down_proj, or "all-linear" for all seven (peft's meaning; the LM head is never adapted)."""
    load_in_4bit: bool = False
    """QLoRA: store the base projections in 4-bit NF4 (CUDA and LoRA only)."""
    optimizer: str = "adamw"
    """"adamw" (two moments in the trainable parameters' dtype) or "adamw_8bit"."""
    bf16_update: str = "plain"
    """memory.bf16_update, for full fine-tuning of 2-byte weights: "fp32_master" (or "auto" with "adamw") adds a
    float32 copy of every trained weight and widens AdamW's moments to float32 (formulas.fp32_master);
    "stochastic_round" (or "auto" with "adamw_8bit") and "plain" add nothing. This default stays "plain" so
    that plans built here directly keep their numbers; ``run_spec`` passes the config's value."""
    num_generations: int = 8
    """G, completions sampled per prompt."""
    prompts_per_step: int = 1
    """Prompts (groups) per optimizer step; rows = prompts_per_step · num_generations."""
    micro_batch_rows: int = 8
    """Completions per forward/backward of the update (gradient accumulation across micro-batches)."""
    max_prompt_length: int = 512
    """P, longest prompt in tokens: ``run_spec`` passes the longest tokenized prompt of the run's
    data where the caller read it (``train/prompts.py``), else data.max_prompt_length."""
    max_completion_length: int = 256
    """T, longest completion in tokens."""
    beta: float = 0.0
    """KL coefficient; > 0 needs reference log-probs (and, with full fine-tuning, a reference copy)."""
    num_iterations: int = 1
    """Policy updates per rollout; > 1 stores old log-probs [rows, T] fp32."""
    ppo: bool = False
    """PPO with a learned critic (loss.advantage_estimator=gae): with LoRA a second adapter and a value head
    on the same base; with full fine-tuning a second model of this shape (critic.model_path), with its
    gradients and optimizer state. Stores old log-probs, old values, returns and advantages [rows, T] fp32."""
    kl_coef: float = 0.0
    """PPO's per-token KL reward (loss.kl_coef); > 0 needs reference log-probs like beta."""
    gradient_checkpointing: bool = False
    """Keep only each layer's input in forward and recompute the layer in backward."""
    offload_activations: bool = False
    """Move the checkpointed layer inputs to host memory (needs gradient_checkpointing; CUDA only helps)."""
    reference_placement: str = "host"
    """CUDA full fine-tuning with a reference: "host" (the copy in host RAM, run on the CPU), "stream" (in host
    RAM, its layers streamed to the GPU for the pass), "device" (a copy on the GPU); "auto" is planned as
    "stream" (the admission settles it against the budget before a run, ``plan/admission.py``)."""
    token_chunk: int = 1024
    """Completion tokens pushed through the LM head at a time in the chunked loss."""
    vocab_chunk: int | None = None
    """Vocabulary entries per LM-head chunk (online log-sum-exp); None = whole vocabulary."""
    chunked_loss: bool = True
    """False = materialise [m, T, V] logits, as a trainer without a chunked head does (for comparisons)."""
    fused_loss: bool = True
    """The update's LM head and loss run as one pass (loss/fused.py: ``loss.fuse_head_loss`` where the objective
    allows it, ``config.sections.loss.takes_fused_path``); False: log-probs through the chunked head, then the loss."""
    entropy_bonus: bool = False
    """loss.entropy_coef != 0 or use_adaptive_entropy: the entropy gets a gradient (the separate path)."""
    padding_mask: bool = True
    """Prompts of a step differ in length, so the generation prefill carries a [g, 1, P, P] padding
    mask (and SDPA repeats keys/values to query width there). The plain update never has one (its rows
    run unpadded with no mask, forward/unpadded.py); a shared-prompt update's prompt pass has one when
    prompts_per_step > 1."""
    attn_implementation: str = "sdpa"
    """Attention kernel (model.attn_implementation): "sdpa", "flash_attention_2" or "eager" are
    modelled (memory/attention.py); any other is assumed O(S) like sdpa and the plan says so."""
    kv_cache_dtype: str = "auto"
    """KV cache storage while decoding (rollout.kv_cache_dtype): "auto" = B bytes per value,
    "fp8_e4m3" / "int8" = 1 byte plus an fp32 scale per token and head (rollout/kv_quant.py)."""
    cuda_graphs: bool = False
    """CUDA decoding replays CUDA graphs of a static-cache step (``SLIMGRPO_CUDA_GRAPHS=1``, rollout/cuda_graph.py):
    its KV arena, sized for the largest call rounded up to the graphs' buckets, is kept from call to call, so
    it is held through the update too."""
    micro_batch_tokens: int | None = None
    """Token budget per update micro-batch (memory.micro_batch_tokens): rows per micro-batch =
    max(1, budget // S) in the worst case where every row is S tokens long; None = micro_batch_rows."""
    share_prompt_forward: bool = True
    """memory.share_prompt_forward: the update runs each group's prompt once when a micro-batch holds
    several rows of one prompt and checkpointing is off (forward/shared_prompt.py)."""
    generation_batch_rows: int | None = None
    """Rows decoded together; None = all rows of the step at once."""
    decode_packing: str = "auto"
    """CPU float32 decoding (rollout/model_parts.py ``packed_weights``): "all" holds oneDNN-packed copies of
    the LM head and every projection while generating, "head" of the LM head only; "auto" is "all" unless
    the projections are under 64 MiB or packing raises the plan's peak (``plan.model.decode_packing``). Not a
    config key: the trainer follows the plan."""
    tiled_mlp: str = "off"
    """memory.tiled_mlp: "on" runs each decoder MLP on ceil(tokens / H) shards of the micro-batch's tokens,
    each recomputed in backward (memory/tiled_mlp.py), so one shard's MLP intermediates are alive instead
    of the whole micro-batch's; "off" does not; "auto" is on where the planner says it pays
    (``plan.model.tiled_mlp_on``: long micro-batches whose update peak it lowers). The config's default is
    "auto" (``run_spec`` passes it); this default stays "off" so that plans built here
    directly keep their numbers."""
    fsdp_shards: int = 1
    """Ranks an FSDP2 job (distributed.strategy=fsdp under torchrun) shards the weights, gradients and
    optimizer state over; 1 = not sharded (one process, or DDP). The plan is then one rank's
    (plan/sharding.py)."""
    ddp: bool = False
    """A DDP job (distributed.strategy=ddp under torchrun, more than one process): the gradients live in DDP's
    all-reduce buckets (gradient_as_bucket_view), allocated once and held all run, generation included."""
    fsdp_generation: str = "gather"
    """distributed.fsdp_generation: how a sharded rollout gets its weights ("gather": one whole copy;
    "per_layer": the root group and one layer at a time)."""
    framework_overhead_bytes: int | None = None
    """Memory the framework holds before any tensor; None = CUDA_FRAMEWORK_OVERHEAD_BYTES on cuda,
    CPU_FRAMEWORK_OVERHEAD_BYTES (measured import RSS) on cpu."""
    rollout_engine: str = "slimgrpo"
    """rollout.engine as resolved: "slimgrpo" (the built-in engine's generation lines) or "vllm" (a colocated
    vLLM's weights copy, KV pool and runtime instead: rollout/costs.py)."""
    vllm_weight_bytes: int = 0
    """Bytes per weight of vLLM's copy (rollout.vllm_dtype); 0 = param_dtype_bytes (vllm_dtype=auto)."""
    vllm_kv_cache_bytes: int | None = None
    """vLLM's KV pool as rollout.vllm_kv_cache_gb sets it; None = sized as the engine sizes it."""
    vllm_context: int = 0
    """Tokens per sequence the engine sizes vLLM's KV pool for: data.max_prompt_length + max_completion_length
    as configured, whatever the data's longest prompt (rollout/vllm_engine.py); 0 = seq_len."""
    vllm_gpu_memory_utilization: float = 0.3
    """CUDA: the fraction of the GPU's memory vLLM claims (rollout.vllm_gpu_memory_utilization)."""
    vllm_sleep: bool = True
    """CUDA: vLLM frees its claim before the update (rollout.vllm_sleep_mode)."""
    gpu_total_bytes: int | None = None
    """CUDA: the GPU's whole memory, for vLLM's claim; None = not known where the plan is made."""

    def __post_init__(self) -> None:
        if self.device not in ("cpu", "cuda"):
            raise ValueError(f"device must be 'cpu' or 'cuda', got {self.device!r}")
        if self.rollout_engine not in ("slimgrpo", "vllm"):
            raise ValueError(f"rollout_engine must be 'slimgrpo' or 'vllm', got {self.rollout_engine!r}")
        if self.param_dtype_bytes not in (2, 4):
            raise ValueError(f"param_dtype_bytes must be 2 (bf16/fp16) or 4 (fp32), got {self.param_dtype_bytes!r}")
        if self.optimizer not in ("adamw", "adamw_8bit"):
            raise ValueError(f"optimizer must be 'adamw' or 'adamw_8bit', got {self.optimizer!r}")
        if self.bf16_update not in ("auto", "fp32_master", "stochastic_round", "plain"):
            raise ValueError(f"bf16_update must be auto, fp32_master, stochastic_round or plain, got {self.bf16_update!r}")
        positive = ("lora_rank", "num_generations", "prompts_per_step", "micro_batch_rows",
                    "max_prompt_length", "max_completion_length", "num_iterations", "token_chunk", "fsdp_shards")
        for name in positive:
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        for name in ("vocab_chunk", "generation_batch_rows", "framework_overhead_bytes", "micro_batch_tokens"):
            value = getattr(self, name)
            low = 0 if name == "framework_overhead_bytes" else 1
            if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < low):
                raise ValueError(f"{name} must be None or an integer >= {low}, got {value!r}")
        if not self.beta >= 0:
            raise ValueError(f"beta must be >= 0, got {self.beta!r}")
        if isinstance(self.lora_target_modules, str):
            object.__setattr__(self, "lora_target_modules", (self.lora_target_modules,))
        elif isinstance(self.lora_target_modules, list):
            object.__setattr__(self, "lora_target_modules", tuple(self.lora_target_modules))
        unknown = [t for t in self.lora_target_modules if t not in LORA_MODULES + ("all-linear",)]
        if unknown or not self.lora_target_modules:
            raise ValueError(
                f"lora_target_modules has unknown names {unknown}; use some of {list(LORA_MODULES)} or 'all-linear'"
            )
        if self.load_in_4bit and not self.lora:
            raise ValueError("load_in_4bit needs lora=True: a 4-bit base cannot be trained directly (QLoRA)")
        if self.load_in_4bit and self.device != "cuda":
            raise ValueError("load_in_4bit (bitsandbytes NF4) is CUDA only; use device='cuda' or drop it")
        if self.fsdp_generation not in ("gather", "per_layer"):
            raise ValueError(f"fsdp_generation must be 'gather' or 'per_layer', got {self.fsdp_generation!r}")
        if self.tiled_mlp not in ("auto", "on", "off"):
            raise ValueError(f"tiled_mlp must be 'auto', 'on' or 'off', got {self.tiled_mlp!r}")
        if self.kv_cache_dtype not in ("auto", "fp8_e4m3", "int8"):
            raise ValueError(f"kv_cache_dtype must be 'auto', 'fp8_e4m3' or 'int8', got {self.kv_cache_dtype!r}")
        if self.offload_activations and not self.gradient_checkpointing:
            raise ValueError(
                "offload_activations needs gradient_checkpointing=True: only checkpointed layer inputs are offloaded"
            )

    @property
    def needs_reference(self) -> bool:
        """Reference log-probs are needed: beta > 0, or PPO's KL reward (kl_coef > 0)."""
        return self.beta > 0 or (self.ppo and self.kl_coef > 0)

    @property
    def rows(self) -> int:
        """Completions per step: prompts_per_step · num_generations."""
        return self.prompts_per_step * self.num_generations

    @property
    def micro_rows(self) -> int:
        """Rows of the largest update micro-batch, every row S tokens long (the worst case)."""
        m = min(self.micro_batch_rows, self.rows)
        if self.micro_batch_tokens is not None:
            m = max(1, min(m, self.micro_batch_tokens // self.seq_len))
        return m

    @property
    def seq_len(self) -> int:
        """S = P + T, tokens per row in the update forward."""
        return self.max_prompt_length + self.max_completion_length

    @property
    def compute_bytes(self) -> int:
        """B: bytes of activations, logits and the KV cache (bf16 compute for a 4-bit base)."""
        return QLORA_COMPUTE_BYTES if self.load_in_4bit else self.param_dtype_bytes

    @property
    def fp32_master(self) -> bool:
        """Whether the run keeps float32 master weights: full fine-tuning of 2-byte weights (bfloat16; float16 full
        fine-tuning is refused at validation) whose ``bf16_update`` resolves to ``fp32_master``
        (config/sections/memory.py ``bf16_update_rule``, the rule update/optim.py follows). LoRA adapters are
        float32."""
        return not self.lora and self.param_dtype_bytes == 2 and \
            bf16_update_rule(self.bf16_update, self.optimizer) == "fp32_master"


DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}  # model.dtype / rollout.vllm_dtype -> bytes per weight


def run_spec(cfg: Config, device: str, world_size: int = 1, vocab: int = 152_064,
             prompt_tokens: int | None = None) -> RunSpec:
    """The spec of ``cfg`` on ``device`` ("cpu" or "cuda"), one process's share under torchrun of ``world_size``
    processes. ``vocab``: the model's vocabulary (the automatic ``loss.token_chunk``); ``prompt_tokens``: the
    longest tokenized prompt of the run's data (``train/prompts.py``), which every prompt is counted at (at most
    ``data.max_prompt_length``); None: the bound itself."""
    dtype_bytes = DTYPE_BYTES.get(cfg.model.dtype, 2 if device == "cuda" else 4)
    prompts = max(cfg.prompts_per_step // max(world_size, 1), 1)
    rows = prompts * cfg.rollout.num_generations
    targets = cfg.lora.target_modules
    return RunSpec(
        device=device, param_dtype_bytes=dtype_bytes, lora=cfg.lora.enabled, lora_rank=cfg.lora.r,
        lora_target_modules=(targets,) if isinstance(targets, str) else tuple(targets),
        load_in_4bit=cfg.model.load_in_4bit, optimizer=cfg.memory.optimizer, bf16_update=cfg.memory.bf16_update,
        num_generations=cfg.rollout.num_generations, prompts_per_step=prompts,
        micro_batch_rows=min(cfg.memory.micro_batch_size or rows, rows),
        max_prompt_length=min(prompt_tokens or cfg.data.max_prompt_length, cfg.data.max_prompt_length),
        max_completion_length=cfg.rollout.max_completion_length,
        beta=cfg.loss.beta, num_iterations=cfg.loss.num_iterations * cfg.loss.steps_per_generation,  # > 1: old log-probs
        ppo=cfg.ppo, kl_coef=cfg.loss.kl_coef,
        gradient_checkpointing=cfg.memory.gradient_checkpointing,
        offload_activations=cfg.memory.offload_activations,
        reference_placement=cfg.memory.reference_placement,
        token_chunk=cfg.loss.token_chunk or auto_token_chunk(vocab),
        vocab_chunk=cfg.loss.vocab_chunk, chunked_loss=True, fused_loss=fused_loss(cfg),
        entropy_bonus=cfg.loss.entropy_bonus,
        generation_batch_rows=cfg.rollout.max_batch_rows,
        attn_implementation=cfg.model.attn_implementation or "sdpa",
        micro_batch_tokens=cfg.memory.micro_batch_tokens,
        share_prompt_forward=cfg.memory.share_prompt_forward,
        kv_cache_dtype=cfg.rollout.kv_cache_dtype,
        tiled_mlp=tiled_mlp_setting(cfg),
        fsdp_shards=world_size if cfg.distributed.strategy == "fsdp" and world_size > 1 else 1,
        ddp=cfg.distributed.strategy == "ddp" and world_size > 1,
        fsdp_generation=cfg.distributed.fsdp_generation,
        cuda_graphs=device == "cuda" and cuda_graphs_asked(),
        **vllm_inputs(cfg, device, dtype_bytes),
    )


def fused_loss(cfg: Config) -> bool:
    """Whether the update's micro-batches take the fused head + loss (``config.sections.loss.takes_fused_path``
    of the config's loss section): the one verdict the plan counts and the update follows (``update/micro_loss.py``).
    An adaptive entropy bonus is the one case decided per optimizer step: while its coefficient is not 0 the
    entropy needs its gradient and that step takes the separate path; it is planned fused, whose blocks are at
    least the separate path's with the bonus."""
    L = cfg.loss
    always_bonus = L.entropy_coef != 0.0 and not L.use_adaptive_entropy
    return takes_fused_path(L.fuse_head_loss, L.top_entropy_quantile, always_bonus, L.importance_sampling_level,
                            cfg.needs_old_logp, L.vocab_chunk)


def vllm_inputs(cfg: Config, device: str, dtype_bytes: int) -> dict[str, Any]:
    """The planner's vLLM fields (rollout/costs.py) from the ``rollout`` section; none when the run uses the
    built-in engine. On CUDA the GPU's memory is read where one is visible (vLLM claims a fraction of it)."""
    r = cfg.rollout
    if resolve_engine(r.engine, device) != "vllm":
        return {}
    total = None
    if device == "cuda":
        index = cuda_index(cfg.run.device)
        if index is not None:
            import torch

            total = int(torch.cuda.mem_get_info(index)[1])
    return {"rollout_engine": "vllm", "vllm_sleep": r.vllm_sleep_mode,
            "vllm_weight_bytes": DTYPE_BYTES.get(r.vllm_dtype, dtype_bytes),
            "vllm_kv_cache_bytes": int(r.vllm_kv_cache_gb * 2**30) if r.vllm_kv_cache_gb is not None else None,
            "vllm_gpu_memory_utilization": r.vllm_gpu_memory_utilization, "gpu_total_bytes": total,
            "vllm_context": cfg.data.max_prompt_length + r.max_completion_length}


def tiled_mlp_setting(cfg: Config) -> str:
    """``memory.tiled_mlp`` as ``auto`` / ``on`` / ``off`` (YAML reads a bare on / off as true / false)."""
    value = cfg.memory.tiled_mlp
    return {True: "on", False: "off"}.get(value, value) if isinstance(value, bool) else value


CUDA_GRAPHS_ENV = "SLIMGRPO_CUDA_GRAPHS"


def cuda_graphs_asked() -> bool:
    """Whether CUDA decoding replays CUDA graphs (``SLIMGRPO_CUDA_GRAPHS=1``: opt-in until measured on a GPU)."""
    return os.environ.get(CUDA_GRAPHS_ENV, "0") not in ("", "0", "false", "no")


def spec_device(cfg: Config, override: str | None = None) -> str:
    """The device kind a run of ``cfg`` shapes its memory for: ``override`` ("cpu" / "cuda") when given, else
    ``run.device`` (``auto``: CUDA where a GPU is visible)."""
    if override:
        return override
    if cfg.run.device == "auto":
        import torch

        return "cuda" if torch.cuda.is_available() else "cpu"
    return "cuda" if cfg.run.device.startswith("cuda") else "cpu"


def cuda_index(run_device: str) -> int | None:
    """The GPU a run uses: N of ``run.device=cuda:N``, else the current device (under torchrun the rank's
    own, set from LOCAL_RANK before any plan); None without CUDA."""
    import torch

    if not torch.cuda.is_available():
        return None
    if run_device.startswith("cuda:"):
        return int(run_device.split(":", 1)[1])
    return torch.cuda.current_device()


@dataclass(frozen=True)
class Admission:
    """What a run's admission decided (``plan/admission.py``), handed to its build (``train/build.py``), which
    applies it. ``cfg``: the config the run builds from (``memory.fit`` applied, the reference placement
    settled); ``spec``: its resolved spec (``decode_packing`` and ``tiled_mlp`` decided where a plan exists);
    ``planned``: the planner models the architecture (a plan was made); ``offload_cap_bytes``: the pinned host
    memory offloaded checkpoints may take (the plan's host line; None: no cap); ``if_untiled``: what happens when
    the MLPs cannot be tiled, said after the reason; ``untiled_refused``: that stops the run (untiled, the plan
    is over ``memory.budget``: exit 4); ``plan``: the plan it was admitted with (None: unplanned)."""

    cfg: Config
    spec: RunSpec
    planned: bool = False
    offload_cap_bytes: int | None = None
    if_untiled: str = "; the run goes on untiled (no plan for this architecture)"
    untiled_refused: bool = False
    plan: MemoryPlan | None = None

    @classmethod
    def unplanned(cls, cfg: Config, world_size: int = 1, prompt_tokens: int | None = None,
                  vocab: int = 152_064) -> Admission:
        """A run admitted without a plan (an architecture the planner does not model, or a policy the caller
        loaded): its spec as configured; ``memory.tiled_mlp`` tiles only when ``on``."""
        spec = run_spec(cfg, spec_device(cfg), world_size, vocab, prompt_tokens)
        tiled = "on" if spec.tiled_mlp == "on" else "off"
        return cls(cfg, dataclasses.replace(spec, tiled_mlp=tiled))
