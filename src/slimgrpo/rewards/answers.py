"""Pulling final answers out of model text and comparing them.

Numbers are compared *exactly* as rational numbers (``fractions.Fraction``), never as floats:

* thousands separators (``1,234``), currency signs (``$ € £ ¥``), a percent sign, LaTeX spacing and
  ``\\text{...}`` wrappers and trailing unit words (``18 dollars``, ``5 cm``) are dropped;
* ``18``, ``18.0``, ``18.00`` and ``+18`` are the same number; ``-0`` is ``0``;
* fractions are values: ``3/4``, ``\\frac{3}{4}`` and ``0.75`` are equal, while ``1/3`` only equals
  ``1/3`` (``0.333`` is a different number: no tolerance);
* ``50%`` equals ``50`` (the sign is dropped, as in GSM8K gold answers), *not* ``0.5``;
* scientific notation is understood (``1e3`` equals ``1000``);
* a comma is only a thousands separator in groups of three (``1,234``); ``1,5`` is not a number.

``normalize_number`` returns a canonical string for a value (``"0.75"``, ``"1/3"``, ``"-3"``) so equal
numbers give equal strings.
"""

from __future__ import annotations

import re
from decimal import Decimal
from fractions import Fraction
from typing import Any

__all__ = [
    "completion_text",
    "parse_number",
    "normalize_number",
    "numbers_match",
    "last_number",
    "last_boxed",
    "extract_tag",
    "gold_answer",
    "model_answer",
    "answer_value",
    "normalize_math_string",
]

# A number body: 1,234,567 (strict groups of three) or 1234, optional decimals, or .5
_BODY = r"(?:\d{1,3}(?:,\d{3})+(?!\d)|\d+)(?:\.\d+)?|\.\d+"
_EXP = r"(?:[eE][-+]?\d+)?"
# In running text: not glued to a preceding ASCII letter/digit/dot (so "x2" and "5-3" give no "-3").
_NUMBER_IN_TEXT = re.compile(
    rf"(?<![A-Za-z0-9_.])(?:(?<![A-Za-z0-9_)])[-+])?(?:{_BODY}){_EXP}(?:\s*/\s*(?:{_BODY}))?"
)
_WHOLE_NUMBER = re.compile(rf"^([-+])?((?:{_BODY}){_EXP})(?:/((?:{_BODY})))?$")
_FRAC = re.compile(r"\\[dt]?frac\s*\{([^{}]*)\}\s*\{([^{}]*)\}")
_FRAC_SHORT = re.compile(r"\\[dt]?frac\s*(\d)\s*(\d)")
_TEXT_WRAPPER = re.compile(r"\\(?:text|textbf|mathrm|mathbf|mbox)\s*\{([^{}]*)\}")
_UNIT_SUFFIX = re.compile(r"\s*[A-Za-z][A-Za-z\s.]*$")
_VARIABLE_PREFIX = re.compile(r"^[A-Za-z]\w*\s*=\s*")


def completion_text(completion: Any) -> str:
    """The text of a completion: a plain string, or the contents of a conversational completion.

    A conversational completion is a list of messages ``[{"role": "assistant", "content": ...}]``;
    the contents of its assistant messages (all messages when none has that role) are joined with
    newlines. A content given as a list of parts keeps the ``{"type": "text", "text": ...}`` parts.
    """
    if completion is None:
        return ""
    if isinstance(completion, str):
        return completion
    if isinstance(completion, dict):
        return _content_text(completion.get("content"))
    if isinstance(completion, (list, tuple)):
        messages = [m for m in completion if isinstance(m, dict)]
        assistant = [m for m in messages if m.get("role") == "assistant"]
        return "\n".join(_content_text(m.get("content")) for m in (assistant or messages))
    return str(completion)


def _content_text(content: Any) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for part in content:
            if isinstance(part, str):
                parts.append(part)
            elif isinstance(part, dict) and isinstance(part.get("text"), str):
                parts.append(part["text"])
        return "".join(parts)
    return str(content)


def _strip_decorations(text: str) -> str:
    """Remove what surrounds a number in model or gold answers: math delimiters, currency, units."""
    s = text.strip().replace("\u2212", "-").replace("\u2013", "-")
    s = s.replace("\\$", "$").replace("\\%", "%")
    for token in ("\\!", "\\,", "\\;", "\\:", "\\ ", "~", "\\left", "\\right"):
        s = s.replace(token, "")
    s = _TEXT_WRAPPER.sub(r" \1", s)
    s = s.strip()
    # Unwrap \( \), \[ \], $ $, \boxed{...} and one pair of braces.
    for _ in range(3):
        boxed = last_boxed(s) if s.startswith(("\\boxed", "\\fbox")) else None
        if boxed is not None:
            s = boxed.strip()
        for left, right in (("\\(", "\\)"), ("\\[", "\\]"), ("$", "$"), ("{", "}")):
            if s.startswith(left) and s.endswith(right) and len(s) >= len(left) + len(right):
                s = s[len(left) : len(s) - len(right)].strip()
    s = _VARIABLE_PREFIX.sub("", s)
    s = s.rstrip(".").strip()
    s = s.lstrip("$€£¥").strip()
    s = s.replace("$", "")
    s = _UNIT_SUFFIX.sub("", s).strip()
    s = s.rstrip("%").strip()
    s = _FRAC_SHORT.sub(r"\1/\2", s)
    s = _FRAC.sub(lambda m: f"{m.group(1).strip()}/{m.group(2).strip()}", s)
    if s.startswith("-") or s.startswith("+"):
        s = s[0] + s[1:].strip()
    return s


def parse_number(text: Any) -> Fraction | None:
    """The exact value of ``text`` when the whole of it is one number (see module docs), else ``None``.

    ``int``/``float`` inputs are accepted too (floats through their shortest ``repr``).
    """
    if isinstance(text, bool) or text is None:
        return None
    if isinstance(text, (int, float)):
        text = repr(text)
        if text in ("nan", "inf", "-inf"):
            return None
    if not isinstance(text, str):
        return None
    s = _strip_decorations(text)
    match = _WHOLE_NUMBER.match(s.replace(" ", ""))
    if match is None:
        return None
    sign, numerator, denominator = match.groups()
    try:
        value = Fraction(numerator.replace(",", ""))
        if denominator is not None:
            value /= Fraction(denominator.replace(",", ""))
    except (ValueError, ZeroDivisionError):
        return None
    return -value if sign == "-" else value


def _canonical(value: Fraction) -> str:
    """``0.75`` for terminating decimals, ``1/3`` otherwise; no trailing zeros, ``-0`` is ``0``."""
    den = value.denominator
    while den % 2 == 0:
        den //= 2
    while den % 5 == 0:
        den //= 5
    if den != 1:
        return f"{value.numerator}/{value.denominator}"
    exact = Decimal(value.numerator) / Decimal(value.denominator)
    text = format(exact, "f")
    if "." in text:
        text = text.rstrip("0").rstrip(".")
    return "0" if text in ("-0", "") else text


def normalize_number(text: Any) -> str | None:
    """Canonical string of the number ``text`` holds (``"$1,234.50"`` -> ``"1234.5"``), else ``None``.

    Equal values give equal strings: ``"3/4"``, ``"\\frac{3}{4}"`` and ``"0.75"`` all give ``"0.75"``;
    ``"1/3"`` gives ``"1/3"``. ``"50%"`` gives ``"50"``. Text that is not a single number gives ``None``.
    """
    value = parse_number(text)
    return None if value is None else _canonical(value)


def numbers_match(a: Any, b: Any) -> bool:
    """True when both parse as numbers (``parse_number``) of exactly the same value."""
    va, vb = parse_number(a), parse_number(b)
    return va is not None and vb is not None and va == vb


def last_number(text: str) -> str | None:
    """The last number written in running text (``"so 3 + 4 = 7."`` -> ``"7"``), raw, or ``None``."""
    matches = _NUMBER_IN_TEXT.findall(text or "")
    return matches[-1] if matches else None


def last_boxed(text: str) -> str | None:
    """Content of the last balanced ``\\boxed{...}`` (or ``\\fbox{...}``), nested braces included."""
    if not text:
        return None
    starts = [m.end() for m in re.finditer(r"\\(?:boxed|fbox)\s*(?=\{)", text)]
    for start in reversed(starts):
        depth = 0
        for i in range(start, len(text)):
            if text[i] == "{":
                depth += 1
            elif text[i] == "}":
                depth -= 1
                if depth == 0:
                    return text[start + 1 : i]
    return None


def extract_tag(text: str, tag: str) -> str | None:
    """Content of the last complete ``<tag>...</tag>`` in ``text`` (DOTALL), stripped, or ``None``."""
    found = re.findall(rf"<{re.escape(tag)}>(.*?)</{re.escape(tag)}>", text or "", flags=re.DOTALL)
    return found[-1].strip() if found else None


def gold_answer(answer: Any) -> str | None:
    """The gold answer of a GSM8K-style solution: what follows the last ``####``, else ``answer`` itself."""
    if answer is None:
        return None
    text = str(answer)
    if "####" in text:
        text = text.rsplit("####", 1)[1]
    text = text.strip()
    return text or None


def model_answer(text: str) -> str | None:
    """The answer segment of a model's text, by the first strategy that applies.

    1. the content of the last ``<answer>...</answer>``;
    2. else the last ``\\boxed{...}``;
    3. else the rest of the line after the last ``####``;
    4. else the last number in the text.
    When a strategy applies, later ones are not tried (an empty ``<answer></answer>`` scores 0).
    """
    text = text or ""
    tagged = extract_tag(text, "answer")
    if tagged is not None:
        return tagged
    boxed = last_boxed(text)
    if boxed is not None:
        return boxed
    if "####" in text:
        rest = text.rsplit("####", 1)[1].strip()
        return rest.splitlines()[0] if rest else ""
    return last_number(text)


def answer_value(segment: str | None) -> Fraction | None:
    """The number an answer segment states: the whole segment, its ``\\boxed{}``, or its last number."""
    if segment is None:
        return None
    value = parse_number(segment)
    if value is None:
        boxed = last_boxed(segment)
        if boxed is not None:
            value = parse_number(boxed)
    if value is None:
        number = last_number(_strip_decorations(segment)) or last_number(segment)
        value = parse_number(number) if number is not None else None
    return value


def normalize_math_string(text: str) -> str:
    """A loose canonical form of a LaTeX answer for string comparison.

    Drops whitespace, ``$``, ``\\left``/``\\right``, LaTeX spacing, ``\\text{}`` wrappers, degree
    marks and a trailing period; maps ``\\dfrac``/``\\tfrac`` to ``\\frac`` and ``\\frac12`` to
    ``\\frac{1}{2}``; lower-cases.
    """
    s = str(text)
    s = _TEXT_WRAPPER.sub(r"\1", s)
    for token in ("\\left", "\\right", "\\!", "\\,", "\\;", "\\:", "\\ ", "$", "^\\circ", "^{\\circ}", "\\%"):
        s = s.replace(token, "")
    s = re.sub(r"\\[dt]frac", r"\\frac", s)
    s = re.sub(r"\\frac(\d)(\d)", r"\\frac{\1}{\2}", s)
    s = re.sub(r"\s+", "", s).rstrip(".")
    return s.casefold()
