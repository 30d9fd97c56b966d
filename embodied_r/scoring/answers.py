"""Reading answers out of ``<think>...</think><answer>...</answer>`` completions, two ways:
``strict`` reads only inside the last ``<answer>`` block and takes an answer naming several
options or none as unparseable (hedging never earns a reward); ``official`` are the official
code's readers, kept so a run can reproduce them."""

from __future__ import annotations

import math
import re
import string
import unicodedata
from typing import Literal

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


def extract_answer(completion: str) -> str | None:
    found = _ANSWER_RE.findall(completion or "")
    if not found:
        return None
    return found[-1].strip()


def extract_think(completion: str) -> str | None:
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
    """The one option letter an answer names (``C``, ``(C)``, ``C. the red door``, ``Option c``,
    ``Answer: C``), upper case; None for none or several. A lower-case letter counts only alone
    or after "option"/"answer", so the article in "a red door" is not option A."""
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
    """The one number an answer gives (``3.5 meters``, ``1,200``, ``three``); None for none,
    several ("3 or 4", "2-3") or a non-finite value."""
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
    return f"{value:.15g}"


# The official code's readers: the rewards as ms-swift's plugin (train/reward/
# choice_accuracy_reward.py), evaluation as calculate_acc (train/conver_format/VLM_perception_local.py).

ChoiceParser = Literal["strict", "official_reward", "official_eval"]
AnswerParser = Literal["strict", "official"]

# ms-swift's built-in ``format`` reward: the completion starts with <think> (no leading
# space), only whitespace between the blocks, and nothing at all after </answer>.
OFFICIAL_FORMAT_RE = re.compile(r"^<think>.*?</think>\s*<answer>.*?</answer>(?![\s\S])", re.DOTALL | re.MULTILINE)

_OFFICIAL_BOXED = re.compile(r"\$\\boxed\{([A-H])\}\$", re.IGNORECASE)
_OFFICIAL_ANSWER_WORD = re.compile(r"answer\s+([A-H])\.?", re.IGNORECASE)
_OFFICIAL_ANSWER_TAG = re.compile(r"<answer>\s*([A-H])", re.IGNORECASE)
_OFFICIAL_DOT = re.compile(r"(?:^|[^A-Za-z])([A-H])\s*\.", re.IGNORECASE)
_OFFICIAL_BARE = re.compile(r"(?:^|[^A-Za-z])([A-H])(?:$|[^A-Za-z])", re.IGNORECASE)


def _first(pattern: re.Pattern[str], text: str) -> str | None:
    match = pattern.search(text)
    return match.group(1).upper() if match else None


def _last(pattern: re.Pattern[str], text: str) -> str | None:
    found = pattern.findall(text)
    return found[-1].upper() if found else None


def official_reward_choice(completion: str | None) -> str | None:
    """The letter the official rewards read from a whole completion, reasoning included: the
    last ``$\\boxed{X}$``, else the first "answer X", else the last letter followed by a dot,
    else the last standalone A-H (any case); None where they read none (their upper-cased text
    then matches no solution). "To answer based on" reads as B."""
    text = (completion or "").strip()
    for pattern, pick in ((_OFFICIAL_BOXED, _last), (_OFFICIAL_ANSWER_WORD, _first),
                          (_OFFICIAL_DOT, _last), (_OFFICIAL_BARE, _last)):
        letter = pick(pattern, text)
        if letter is not None:
            return letter
    return None


# The official local reward's conclusion phrases, tried when no letter pattern matched.
_OFFICIAL_CONCLUSIONS = (
    re.compile(r"(?:so|thus|in conclusion|the answer is|choose|select|option|answer)[^A-H]*([A-H])\b",
               re.IGNORECASE),
    re.compile(r"(?:the answer is|choose|select|option|answer)[^A-H]*([A-H])\b", re.IGNORECASE),
    re.compile(r"\b([A-H])\s+(?:is correct)\b", re.IGNORECASE),
)


def official_think_choice(think: str | None) -> str | None:
    """The letter the official local consistency reward (5-GPU script) reads from the policy's
    ``<think>`` when its reference gives no reply: the *last* match of the first pattern that
    matches. The standalone letter takes the article "a" too, so most reasoning yields A."""
    text = think or ""
    for pattern in (_OFFICIAL_BOXED, _OFFICIAL_ANSWER_WORD, _OFFICIAL_DOT, _OFFICIAL_BARE, *_OFFICIAL_CONCLUSIONS):
        letter = _last(pattern, text)
        if letter is not None:
            return letter
    return None


def think_fallback_reward(think: str, policy_answer: str | float | None, answer_type: str = "choice") -> float:
    """1.0 when ``official_think_choice`` of the policy's ``<think>`` is its answer; a numeric
    answer scores 0.0."""
    if answer_type == "number" or not isinstance(policy_answer, str):
        return 0.0
    letter = official_think_choice(think)
    return 1.0 if letter is not None and letter == policy_answer else 0.0


def official_eval_choice(completion: str | None) -> str | None:
    """The official evaluation's letter: the first right after ``<answer>``, else the last
    followed by a dot; None (wrong) where it reads none."""
    text = (completion or "").strip()
    return _first(_OFFICIAL_ANSWER_TAG, text) or _last(_OFFICIAL_DOT, text)


def read_choice(completion: str | None, n_options: int | None = None,
                parser: ChoiceParser = "strict") -> str | None:
    if parser == "strict":
        return parse_choice(extract_answer(completion or ""), n_options)
    if parser == "official_reward":
        return official_reward_choice(completion)
    if parser == "official_eval":
        return official_eval_choice(completion)
    raise ValueError(f"unknown answer parser {parser!r} (strict, official_reward, official_eval)")


def format_ok(completion: str | None, rule: AnswerParser = "strict") -> bool:
    if rule == "official":
        return OFFICIAL_FORMAT_RE.match(completion or "") is not None
    if rule == "strict":
        return FORMAT_RE.match(completion or "") is not None
    raise ValueError(f"unknown format rule {rule!r} (strict or official)")
