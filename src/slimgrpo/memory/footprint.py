"""What a training process holds besides its tensors: the framework's imports and context, and the tokenizer.
Measured constants; the planner counts them in every plan (``plan/model.py``) and the trace adds them to the live
tensor bytes it sees (``trace/step.py``)."""

from __future__ import annotations

KiB, MiB = 1024, 1024**2

# ----------------------------------------------------------------------------------------------
# Modelling constants (calibrate here)
# ----------------------------------------------------------------------------------------------
# CUDA context, cuBLAS/cuDNN workspaces and allocator slack: real device memory that
# torch.cuda.max_memory_allocated() does not see but nvidia-smi does.
CUDA_FRAMEWORK_OVERHEAD_BYTES = 512 * MiB
# Peak RSS of a bare Python that imported torch 2.13 (CPU), transformers 5.25, peft 0.21 (which imports
# torchao 0.18) and the Qwen2/Llama model classes: ru_maxrss = 373,480 KiB (about 365 MiB; three runs within
# 0.2 MiB), measured on the 2-core development machine on 2026-12-04 (with transformers 5.23 it was 352,396 KiB:
# the constant follows the versions installed, re-measure it when they move). On CPU the floor under every plan.
CPU_FRAMEWORK_OVERHEAD_BYTES = 373_480 * KiB
# The tokenizer a run loads (its vocabulary and merges as Rust and Python objects): RSS it keeps once loaded, in a
# process that imported the trainer, measured for three fast BPE tokenizers on the development machine: Qwen2's
# 151,936 entries 152 MiB, SmolLM2's 49,152 entries 45 MiB, a 32,000-entry Llama one 31 MiB, about 1,000 B per
# entry (docs/memory.md#framework-overhead-always). Host memory: in the plan's peak on CPU only.
TOKENIZER_BYTES_PER_VOCAB = 1_000


def tokenizer_bytes(vocab: int) -> int:
    """RSS a loaded tokenizer of ``vocab`` entries keeps (TOKENIZER_BYTES_PER_VOCAB each)."""
    return TOKENIZER_BYTES_PER_VOCAB * vocab


def cpu_runtime_bytes(vocab: int) -> int:
    """What a CPU run's RSS holds besides tensors: the imports (CPU_FRAMEWORK_OVERHEAD_BYTES) and the tokenizer."""
    return CPU_FRAMEWORK_OVERHEAD_BYTES + tokenizer_bytes(vocab)
