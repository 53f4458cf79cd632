"""Build byte-level BPE tokenizers in code, with chosen token ids.

A stand-in tokenizer must behave like the hub tokenizer it replaces only where a test can see it:

* the special tokens (names, ids, which one is eos / pad / bos), because the tests and the trainer look them up;
* the chat template, because TRL picks tool-call parsers by comparing the template text;
* a handful of ordinary token ids that TRL's tests write out as literal integers (fake ``generate`` outputs for
  the tool-calling tests). Those ids must decode to the same text as in the real vocabulary.

Everything else is filler: ids 0..255 are the 256 byte symbols in the usual GPT-2 order, the pinned tokens sit at
their real ids, and every other id below the first special token holds a unique made-up word. Merges are only the
chains that spell the pinned tokens, so text encodes to pinned tokens where it can and to single bytes otherwise.
"""

from __future__ import annotations

import itertools
import json
import string

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers, processors

# The split pattern used by Qwen2 / Qwen3 style tokenizers (contractions, letter runs with one leading non-letter,
# single digits, punctuation runs with trailing newlines, whitespace).
SPLIT_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)


def byte_symbols() -> tuple[list[int], dict[int, str]]:
    """Return (bytes in id order, byte -> printable symbol) for the reversible byte-level alphabet."""
    printable = (
        list(range(ord("!"), ord("~") + 1))
        + list(range(ord("\u00a1"), ord("\u00ac") + 1))
        + list(range(ord("\u00ae"), ord("\u00ff") + 1))
    )
    order = list(printable)
    symbol = {b: chr(b) for b in printable}
    extra = 0
    for b in range(256):
        if b not in symbol:
            order.append(b)
            symbol[b] = chr(256 + extra)
            extra += 1
    return order, symbol


BYTE_ORDER, BYTE_SYMBOL = byte_symbols()


def to_symbols(text: str) -> str:
    return "".join(BYTE_SYMBOL[b] for b in text.encode("utf-8"))


def _filler_words():
    letters = string.ascii_lowercase
    for length in itertools.count(3):
        for combo in itertools.product(letters, repeat=length):
            yield to_symbols(" z" + "".join(combo))


def build_tokenizer(
    *,
    n_regular: int,
    specials: list[tuple[int, str, bool]],
    pinned: dict[int, str] | None = None,
    bos: str | None = None,
    add_bos: bool = False,
) -> Tokenizer:
    """Build a ``tokenizers.Tokenizer``.

    Args:
        n_regular: number of ordinary ids (``0 .. n_regular-1``); specials must not use these ids.
        specials: ``(id, text, is_special)`` for each added token; ids must be contiguous from ``n_regular``.
        pinned: ``{id: text}`` ordinary tokens that must sit at exactly these ids.
        bos / add_bos: prepend ``bos`` to every encoded sequence (Llama / Gemma style).
    """
    pinned = dict(pinned or {})
    vocab: dict[str, int] = {}
    for idx, b in enumerate(BYTE_ORDER):
        vocab[BYTE_SYMBOL[b]] = idx
    used = set(vocab.values())

    for idx, text in sorted(pinned.items()):
        sym = to_symbols(text)
        if sym in vocab:
            if vocab[sym] != idx:
                raise ValueError(f"pinned token {text!r} wants id {idx} but is already id {vocab[sym]}")
            continue
        if idx in used:
            raise ValueError(f"pinned id {idx} ({text!r}) collides with another token")
        if idx >= n_regular:
            raise ValueError(f"pinned id {idx} is not below n_regular={n_regular}")
        vocab[sym] = idx
        used.add(idx)

    free_ids = (i for i in range(256, n_regular) if i not in used)

    merges: list[tuple[str, str]] = []
    seen_merges = set()
    for _, text in sorted(pinned.items()):
        sym = to_symbols(text)
        if len(sym) < 2:
            continue
        current = sym[0]
        for ch in sym[1:]:
            pair = (current, ch)
            current = current + ch
            if pair not in seen_merges:
                seen_merges.add(pair)
                merges.append(pair)
            if current not in vocab:
                idx = next(free_ids)
                vocab[current] = idx
                used.add(idx)

    words = _filler_words()
    for idx in free_ids:
        word = next(words)
        while word in vocab:
            word = next(words)
        vocab[word] = idx

    expected = list(range(n_regular, n_regular + len(specials)))
    if sorted(i for i, _, _ in specials) != expected:
        raise ValueError("special token ids must be contiguous from n_regular")
    for idx, text, _ in specials:
        vocab[text] = idx

    bpe = models.BPE(vocab=vocab, merges=merges, ignore_merges=True, fuse_unk=False, byte_fallback=False)
    tok = Tokenizer(bpe)
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(SPLIT_PATTERN), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    added = [AddedToken(text, special=is_special, normalized=False) for _, text, is_special in sorted(specials)]
    tok.add_tokens(added)
    for (idx, text, _) in specials:
        assert tok.token_to_id(text) == idx, (text, idx, tok.token_to_id(text))
    if add_bos:
        assert bos is not None
        bos_id = tok.token_to_id(bos)
        tok.post_processor = processors.TemplateProcessing(
            single=f"{bos} $A", pair=f"{bos} $A {bos} $B", special_tokens=[(bos, bos_id)]
        )
    else:
        tok.post_processor = processors.ByteLevel(trim_offsets=False)
    return tok


def wrap(tok: Tokenizer, *, chat_template: str | None, model_max_length: int = 131072, **special_tokens):
    """Wrap as a ``PreTrainedTokenizerFast`` with the given special-token roles (eos_token=..., pad_token=...)."""
    from transformers import PreTrainedTokenizerFast

    kwargs = {k: v for k, v in special_tokens.items() if v is not None}
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, model_max_length=model_max_length, **kwargs)
    if chat_template is not None:
        fast.chat_template = chat_template
    return fast


def check_encodings(fast, cases: dict[str, list[int]]) -> list[str]:
    """Return a list of human-readable mismatches between ``fast.encode`` / ``decode`` and expected ids."""
    problems = []
    for text, ids in cases.items():
        got = fast.encode(text, add_special_tokens=False)
        if got != ids:
            problems.append(f"encode {text!r}: expected {ids}, got {got}")
        back = fast.decode(ids, skip_special_tokens=False)
        if back != text:
            problems.append(f"decode {ids}: expected {text!r}, got {back!r}")
    return problems


def dump_json(path, obj):
    with open(path, "w", encoding="utf-8") as fh:
        json.dump(obj, fh, indent=2, sort_keys=True)
        fh.write("\n")
