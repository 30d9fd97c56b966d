"""Reading answers out of model completions.

The reasoner writes ``<think>...</think><answer>...</answer>``. Everything that scores a
completion (rewards, evaluation) reads the answer only from inside the last ``<answer>``
block, never from the reasoning: the original code scanned the whole completion, so a
thought like "Option B is wrong" was read as the answer B.

Parsing is strict on purpose. An answer that names several options ("A or B") or none
is unparseable and scores 0, so hedging never earns a reward.
"""

from __future__ import annotations

import math
import re
import string
import unicodedata

# Inner text may not contain another think/answer tag: a completion with repeated or
# nested blocks is not in the format, and each block must say something.
_TAG = r"</?(?:think|answer)>"
# Written so that each character has one way to match: the check stays linear on long outputs.
_INNER = rf"\s*(?!{_TAG})\S(?:(?!{_TAG}).)*"
FORMAT_RE = re.compile(
    rf"\A\s*<think>{_INNER}</think>\s*<answer>{_INNER}</answer>\s*\Z",
    re.DOTALL,
)

_ANSWER_RE = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)
_THINK_RE = re.compile(r"<think>(.*?)</think>", re.DOTALL)

# Wrappers a model puts around a bare answer: markdown emphasis, quotes, LaTeX boxes.
_BOXED_RE = re.compile(r"^\$?\\boxed\{(.*)\}\$?$", re.DOTALL)
_STRIP_CHARS = " \t\r\n*_`'\"“”‘’"
_PREFIX_RE = re.compile(
    r"^(?:(?:the\s+)?(?:final\s+|correct\s+)?answer\b\s*(?:is\b)?\s*:?\s*)?"
    r"(?:(?:the\s+)?(?:option|choice)\b\s*:?\s*)?",
    re.IGNORECASE,
)
# A letter, optionally bracketed, followed by a delimiter, a space or the end.
_LETTER_RE = re.compile(r"^([(\[])?([A-Za-z])([)\]])?(?=$|[.:)\]\s,;/&])(.*)$", re.DOTALL)
# The rest of an answer naming a second option: "A or B", "A, C", "A/B", "A and C".
_SECOND_OPTION_RE = re.compile(
    r"^\s*(?:[.:)\]]\s*)?(?:,|;|/|&|\bor\b|\band\b)\s*(?:option\s*)?[(\[]?[A-Za-z][)\].]?(?:$|\W)",
    re.IGNORECASE,
)
# An answer that goes on to list further options on their own lines.
_LISTED_OPTION_RE = re.compile(r"\n\s*[(\[]?[A-Z][.)\]]")

_NUMBER_TOKEN_RE = re.compile(r"[-+]?\d[\d,]*(?:\.\d+)?(?:[eE][-+]?\d+)?|[-+]?\.\d+(?:[eE][-+]?\d+)?")
_THOUSANDS_RE = re.compile(r"[-+]?\d{1,3}(?:,\d{3})+(?:\.\d+)?(?:[eE][-+]?\d+)?")
_NUMBER_WORDS = {
    w: float(i)
    for i, w in enumerate(
        "zero one two three four five six seven eight nine ten eleven twelve thirteen "
        "fourteen fifteen sixteen seventeen eighteen nineteen twenty".split()
    )
}


def completion_text(completion: object) -> str:
    """The text of a completion given as a string or as chat messages (TRL's two forms)."""
    if completion is None:
        return ""
    if isinstance(completion, str):
        return completion
    if isinstance(completion, dict):
        completion = [completion]
    parts: list[str] = []
    for message in completion:  # type: ignore[union-attr]
        if not isinstance(message, dict) or message.get("role", "assistant") != "assistant":
            continue
        content = message.get("content")
        if isinstance(content, str):
            parts.append(content)
        elif isinstance(content, list):
            parts.extend(
                p.get("text", "") for p in content if isinstance(p, dict) and p.get("type") == "text"
            )
    return "".join(parts)


def extract_answer(completion: str) -> str | None:
    """Text inside the last ``<answer>...</answer>``, stripped; None when there is none."""
    found = _ANSWER_RE.findall(completion or "")
    if not found:
        return None
    return found[-1].strip()


def extract_think(completion: str) -> str | None:
    """Text inside the first ``<think>...</think>``, stripped; None when there is none."""
    match = _THINK_RE.search(completion or "")
    if match is None:
        return None
    return match.group(1).strip()


def _normalise(text: str) -> str:
    # NFKC folds full-width letters and digits ("Ｃ", "３") into ASCII.
    text = unicodedata.normalize("NFKC", text).strip(_STRIP_CHARS)
    boxed = _BOXED_RE.match(text)
    if boxed:
        text = boxed.group(1).strip(_STRIP_CHARS)
    return text


def parse_choice(text: str | None, n_options: int | None = None) -> str | None:
    """The single option letter an answer names, upper case; None when it names none or several.

    Accepts ``C``, ``C.``, ``(C)``, ``C. the red door``, ``Option C``, ``option c``,
    ``Answer: C``. A lower-case letter counts only alone or after "option"/"answer", so
    the article in "a red door" is not read as option A.
    """
    if text is None:
        return None
    text = _normalise(text)
    if not text:
        return None
    prefix = _PREFIX_RE.match(text)
    has_prefix = bool(prefix and prefix.group(0).strip())
    rest = text[prefix.end() :] if prefix else text
    match = _LETTER_RE.match(rest)
    if match is None:
        return None
    _, letter, close, tail = match.groups()
    if letter.islower() and not has_prefix and tail.strip(" .:)]"):
        return None
    # "A red door" is a sentence, not an option; "A. red door" and "(A) red door" are options.
    if close is None and tail[:1].isspace() and tail.strip():
        return None
    if _SECOND_OPTION_RE.match(tail) or _LISTED_OPTION_RE.search(tail):
        return None
    letter = letter.upper()
    if n_options is not None and n_options > 0:
        if letter not in string.ascii_uppercase[:n_options]:
            return None
    return letter


def parse_number(text: str | None) -> float | None:
    """The one number an answer gives (``3.5``, ``3.5 meters``, ``1,200``, ``three``).

    None when it gives none, several ("3 or 4", "2-3"), or a non-finite value.
    """
    if text is None:
        return None
    text = _normalise(text)
    if not text:
        return None
    found = [t.rstrip(",") for t in _NUMBER_TOKEN_RE.findall(text)]
    if len(found) == 1 and ("," not in found[0] or _THOUSANDS_RE.fullmatch(found[0])):
        value = float(found[0].replace(",", ""))
        return value if math.isfinite(value) else None
    if not found:
        words = re.findall(r"[a-z]+", text.lower())
        hits = [_NUMBER_WORDS[w] for w in words if w in _NUMBER_WORDS]
        if len(hits) == 1:
            return hits[0]
    return None


def format_number(value: float) -> str:
    """A parsed number as text, without a trailing ``.0`` for whole numbers."""
    return f"{value:.15g}"
