"""The update measured alone: the chunked LM head against full logits (``loss_head``), each group's prompt run
once (``shared_prompt``), bf16 weights' optimizer steps (``bf16_update``) and the streamed reference
(``reference_stream``)."""
