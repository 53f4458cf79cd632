"""What the attention kernel allocates, for the memory planner.

The update runs unpadded rows with ``attention_mask=None`` (``loss.unpadded``), generation prefills
left-padded prompts with a padding mask and decodes one token at a time. What that costs depends on
the kernel ``model.attn_implementation`` names:

    kernel              update (no mask)                       prefill (padding mask)
    ------------------  -------------------------------------  ----------------------------------
    sdpa (CPU, CUDA)    flash / memory-efficient: q, k, v,     HF builds a bool [g, 1, P, P] mask,
                        output and an fp32 log-sum-exp         SDPA converts it to the query dtype
                        [heads] per token; GQA folded in       (g·P²·(1 + B)); k/v repeated to
                        (enable_gqa), no S² tensor             query width
    flash_attention_2   same as sdpa: O(S), lse per token      unpads by the mask: no P² tensor
    eager               scores and softmax [m, heads, S, S]    the same, P² per head plus the
                        per layer (saved for backward), a      float mask
                        float causal mask [m, 1, S, S], k/v
                        repeated to query width
    anything else       not modelled: assumed to be O(S) like sdpa, and the plan says so

Decode steps attend one query to the cache: [rows, heads, 1, S] at most, counted in the KV cache
line's slack, no S² anywhere.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import os
from collections.abc import Iterator

KNOWN = ("sdpa", "flash_attention_2", "eager")
GQA_ENV = "TRANSFORMERS_SDPA_FORCE_GQA"  # Hugging Face's switch: sdpa with enable_gqa even under a mask
_OURS = "SLIMGRPO_SET_SDPA_FORCE_GQA"  # marks a GQA_ENV that cpu_gqa set (not the user)
_backported: dict = {}  # "use_gqa_in_sdpa": the wrapper _backport_switch put in transformers (older ones only)


def kernel(name: str | None) -> tuple[str, str | None]:
    """(kernel the planner models, a note when it cannot know ``name``'s memory)."""
    name = (name or "sdpa").lower()
    if name in KNOWN:
        return name, None
    return "sdpa", (f"attention kernel {name!r} is not modelled by the planner; its memory is assumed to be "
                    f"O(S) like sdpa (known kernels: {', '.join(KNOWN)})")


def kv_width(shape, name: str, padded: bool, device: str = "cuda") -> int:
    """Width of the keys/values the kernel keeps per token: kv_heads·head_dim when grouped-query
    attention stays folded (sdpa without a mask, sdpa on CPU always: ``native_gqa``,
    flash_attention_2), heads·head_dim when they are repeated to query width (eager always; sdpa on
    other devices whenever a mask is passed)."""
    if name == "eager" or (name == "sdpa" and padded and not native_gqa(device)):
        return shape.q_dim
    return shape.kv_dim


def native_gqa(device: str) -> bool:
    """True where sdpa runs grouped-query attention without repeating keys and values, even with a mask:
    on CPU, where slimgrpo turns on Hugging Face's ``TRANSFORMERS_SDPA_FORCE_GQA`` (``cpu_gqa``; torch's
    CPU flash kernel takes ``enable_gqa`` with a mask, forward and backward), unless the user set it to
    something else or the installed transformers has neither the switch nor the function it lives in."""
    return device == "cpu" and os.environ.get(GQA_ENV, "1") == "1" and _gqa_switch() is not None


@functools.lru_cache(maxsize=1)
def _gqa_switch() -> str | None:
    """How the installed transformers comes to read ``GQA_ENV``: "reads" (5.23 and later: ``use_gqa_in_sdpa``
    returns True when it is "1"), "backport" (5.17-5.22: ``use_gqa_in_sdpa`` decides alone, without the switch;
    ``_backport_switch`` wraps it to read it the same way), None (no such function: K/V are repeated)."""
    try:
        from transformers.integrations import sdpa_attention
        decide = sdpa_attention.use_gqa_in_sdpa
    except (ImportError, AttributeError):
        return None
    if decide is _backported.get("use_gqa_in_sdpa"):
        return "backport"
    try:
        return "reads" if GQA_ENV in inspect.getsource(decide) else "backport"
    except (OSError, TypeError):
        return "backport"


def _backport_switch() -> None:
    """Older transformers (5.17-5.22, the lent GPU machine's 5.17 among them) repeat K/V whenever a mask is
    passed and have no switch: their ``use_gqa_in_sdpa``, which ``sdpa_attention_forward`` looks up at each call,
    is wrapped once to answer True when ``GQA_ENV`` is "1", as 5.23's does; unset, it answers as before."""
    from transformers.integrations import sdpa_attention

    decide = sdpa_attention.use_gqa_in_sdpa
    if decide is _backported.get("use_gqa_in_sdpa"):
        return

    def use_gqa_in_sdpa(*args, **kwargs):
        return os.environ.get(GQA_ENV, "0") == "1" or decide(*args, **kwargs)

    _backported["use_gqa_in_sdpa"] = use_gqa_in_sdpa
    use_gqa_in_sdpa.__doc__ = f"{decide.__doc__ or ''}\n(slimgrpo: True when {GQA_ENV}=1, as in transformers 5.23.)"
    sdpa_attention.use_gqa_in_sdpa = use_gqa_in_sdpa


@contextlib.contextmanager
def cpu_gqa(device: str) -> Iterator[None]:
    """Within: Hugging Face's sdpa passes ``enable_gqa`` instead of repeating keys and values to query
    width when ``device`` is CPU (what ``native_gqa`` tells the planner), so a masked pass (prefill, the
    shared-prompt update, padded rows) keeps [rows, kv_heads, S, d] keys and values, not [rows, heads, S,
    d]: SmolLM2 (9 heads on 3) at 16 x 229 tokens, peak RSS of a step 6,282 -> 5,908 MiB. Elsewhere the
    switch is cleared for the duration (the masked GPU kernels take no ``enable_gqa``); a value the user
    set is kept either way. On transformers 5.17-5.22, which have no such switch, the function that reads it
    in 5.23 is taught to (``_backport_switch``)."""
    if _gqa_switch() == "backport":
        _backport_switch()
    before = os.environ.get(GQA_ENV)
    if before is not None and not os.environ.get(_OURS):
        yield
        return
    if device == "cpu":
        os.environ[GQA_ENV], os.environ[_OURS] = "1", "1"
    else:
        os.environ.pop(GQA_ENV, None)
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(GQA_ENV, None)
            os.environ.pop(_OURS, None)
        else:
            os.environ[GQA_ENV] = before


def quadratic_bytes(shape, name: str, pairs: int, B: int, padded: bool) -> tuple[int, int, str]:
    """(shared, per_layer, formula) bytes that grow with S² for ``pairs`` (query, key) positions:
    rows·S² for ``rows`` sequences of S tokens; g·P² + m·T·(P + T) for a shared-prompt update.

    per_layer is what one layer keeps for backward (and what a no-grad forward holds transiently).
    """
    S2 = pairs
    if name == "eager":
        # scores in B, softmax in fp32 (cast back to B when B < 4): kept for the backward matmul
        per_head = B + (4 if B < 4 else 0)
        return S2 * B, S2 * shape.heads * per_head, (f"eager: [m, heads, S, S]·{per_head} B per layer + "
                                                      f"float mask m·S²·{B}")
    if name == "sdpa" and padded:
        return S2, S2 * B, f"sdpa padding mask: bool m·S² + m·S²·{B} per layer"
    return 0, 0, f"{name}: no S² tensor"
