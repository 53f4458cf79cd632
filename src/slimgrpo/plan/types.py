"""The planner's typed containers: what a plan depends on (PlanInputs) and what it returns
(Component lines and the MemoryPlan they add up to). The formulas live in formulas.py and planner.py."""

from __future__ import annotations

from dataclasses import dataclass, field

from slimgrpo.plan.shapes import ModelShape

PHASES = ("always", "generation", "update")
LORA_MODULES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


@dataclass(frozen=True)
class PlanInputs:
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
    that plans built here directly keep their numbers; ``memory.check.plan_inputs`` passes the config's value."""
    num_generations: int = 8
    """G, completions sampled per prompt."""
    prompts_per_step: int = 1
    """Prompts (groups) per optimizer step; rows = prompts_per_step · num_generations."""
    micro_batch_rows: int = 8
    """Completions per forward/backward of the update (gradient accumulation across micro-batches)."""
    max_prompt_length: int = 512
    """P, longest prompt in tokens: ``plan.check.plan_inputs`` passes the longest tokenized prompt of the run's
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
    "stream" (``memory.check`` settles it against the budget before a run)."""
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
    run unpadded with no mask, loss/unpadded.py); a shared-prompt update's prompt pass has one when
    prompts_per_step > 1."""
    attn_implementation: str = "sdpa"
    """Attention kernel (model.attn_implementation): "sdpa", "flash_attention_2" or "eager" are
    modelled (memory/attention.py); any other is assumed O(S) like sdpa and the plan says so."""
    kv_cache_dtype: str = "auto"
    """KV cache storage while decoding (rollout.kv_cache_dtype): "auto" = B bytes per value,
    "fp8_e4m3" / "int8" = 1 byte plus an fp32 scale per token and head (rollout/kv_quant.py)."""
    micro_batch_tokens: int | None = None
    """Token budget per update micro-batch (memory.micro_batch_tokens): rows per micro-batch =
    max(1, budget // S) in the worst case where every row is S tokens long; None = micro_batch_rows."""
    share_prompt_forward: bool = True
    """memory.share_prompt_forward: the update runs each group's prompt once when a micro-batch holds
    several rows of one prompt and checkpointing is off (loss/shared_prompt.py)."""
    generation_batch_rows: int | None = None
    """Rows decoded together; None = all rows of the step at once."""
    decode_packing: str = "auto"
    """CPU float32 decoding (rollout/model_parts.py ``packed_weights``): "all" holds oneDNN-packed copies of
    the LM head and every projection while generating, "head" of the LM head only; "auto" is "all" unless
    the projections are under 64 MiB or packing raises the plan's peak (``planner.decode_packing``). Not a
    config key: the trainer follows the plan."""
    tiled_mlp: str = "off"
    """memory.tiled_mlp: "on" runs each decoder MLP on ceil(tokens / H) shards of the micro-batch's tokens,
    each recomputed in backward (memory/tiled_mlp.py), so one shard's MLP intermediates are alive instead
    of the whole micro-batch's; "off" does not; "auto" is on where the planner says it pays
    (``planner.tiled_mlp_on``: long micro-batches whose update peak it lowers). The config's default is
    "auto" (``memory.check.plan_inputs`` passes it); this default stays "off" so that plans built here
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
    vLLM's weights copy, KV pool and runtime instead: plan/vllm.py)."""
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


@dataclass(frozen=True)
class Component:
    """One line of the plan."""

    name: str
    bytes: int
    phase: str  # "always" | "generation" | "update"
    formula: str  # how `bytes` was computed, with the numbers filled in
    location: str = "device"  # "device", or "host" for bytes parked in CPU RAM during a CUDA run


@dataclass(frozen=True)
class MemoryPlan:
    """Bytes per component, and the peak they add up to."""

    shape: ModelShape
    inputs: PlanInputs
    components: list[Component]
    peak_bytes: int  # device peak (GPU memory on cuda, process RSS on cpu), framework overhead included
    peak_phase: str  # "generation" or "update": the phase that sets the peak
    host_bytes: int  # CUDA runs: host RAM held by offloaded activations and the reference copy
    notes: list[str] = field(default_factory=list)  # warnings about the inputs

    def phase_total(self, phase: str) -> int:
        """Device bytes of the components of one phase."""
        if phase not in PHASES:
            raise ValueError(f"unknown phase {phase!r}; phases are {PHASES}")
        return sum(c.bytes for c in self.components if c.phase == phase and c.location == "device")

    @property
    def phase_totals(self) -> dict[str, int]:
        return {p: self.phase_total(p) for p in PHASES}

    def bytes_of(self, name: str) -> int:
        """Bytes of the named component (device and host lines together)."""
        found = [c for c in self.components if c.name == name]
        if not found:
            raise ValueError(f"no component {name!r}; components are {[c.name for c in self.components]}")
        return sum(c.bytes for c in found)

    @property
    def framework_bytes(self) -> int:
        """What the device holds besides tensors: the framework (CUDA context, or the CPU process's imports) and,
        on CPU, the tokenizer."""
        return sum(c.bytes for c in self.components if c.name in ("framework overhead", "tokenizer"))

    @property
    def tensor_peak_bytes(self) -> int:
        """Peak without framework overhead: compare with torch.cuda.max_memory_allocated()."""
        return self.peak_bytes - self.framework_bytes

    def fits(self, budget_bytes: int) -> bool:
        return self.peak_bytes <= budget_bytes
