"""The forward room: how a micro-batch's rows go through the decoder to the hidden states the LM head takes.

- ``rows.py``: ``CompletionRows`` (the padded rows every layout takes) and the padded layout, the LM head spec;
- ``unpadded.py``, ``packed.py``, ``shared_prompt.py``: the three layouts of the update;
- ``layout.py``: the choice between them (``choose_layout``, with ``PromptSharing``'s verdict) and the one way
  into the model through a DDP / FSDP2 wrapper (``forward``);
- ``passes.py``: a pass over rows into the loss's head kernels (``completion_logprobs``, ``completion_loss``);
- ``costs.py``: what these forwards keep and hold, per token and layer (the planner's activation lines);
- ``gather.py``: row gathers whose backward sums repeats in order.
"""

from slimgrpo.forward.layout import PromptSharing, choose_layout, forward
from slimgrpo.forward.passes import completion_logprobs, completion_loss
from slimgrpo.forward.rows import CompletionRows, completion_hidden, lm_head_spec

__all__ = ["CompletionRows", "PromptSharing", "choose_layout", "completion_hidden", "completion_logprobs",
           "completion_loss", "forward", "lm_head_spec"]
