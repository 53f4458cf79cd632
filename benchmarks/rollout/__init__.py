"""Generation measured alone: slimgrpo's engine against Hugging Face ``generate`` and the hardware bound
(``vs_hf``), against vLLM (``vs_vllm``), CUDA-graph decoding (``decode_graphs``) and decoding on a busy machine
(``busy_machine``)."""
