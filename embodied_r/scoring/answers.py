"""Reading answers out of model completions.

The reasoner writes ``<think>...</think><answer>...</answer>``. Two ways of reading it:

- ``strict`` (this project's): the answer is read only from inside the last ``<answer>``
  block, never from the reasoning. An answer that names several options ("A or B") or
  none is unparseable and scores 0, so hedging never earns a reward.
- ``official``: the official code's readers, kept so that a run can reproduce it
  (``official_reward_choice``, ``official_eval_choice``, ``OFFICIAL_FORMAT_RE``). Its
  reward scans the whole completion, reasoning included, so a thought like
  "Option A. is wrong" is read as the answer A whatever the ``<answer>`` block says.
"""

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


# -- the official code's readers ----------------------------------------------------------
#
# ``official`` in a recipe: the training rewards read answers as ms-swift's plugin of the
# official code does (train/reward/choice_accuracy_reward.py), the evaluation as its
# scoring script does (calculate_acc in train/conver_format/VLM_perception_local.py).

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
    """The letter the official accuracy and consistency rewards read from a whole
    completion, reasoning included; None where they read no letter (the official code then
    compares the upper-cased text, which matches no solution letter).

    In order: the last ``$\\boxed{X}$``; else the first "answer X"; else the last letter
    followed by a dot; else the last standalone letter (A-H, any case). So
    ``"<think>Option A. is wrong</think><answer>B</answer>"`` reads as A, and
    ``"<think>To answer based on ...</think>"`` as B (from "answer b").
    """
    text = (completion or "").strip()
    for pattern, pick in ((_OFFICIAL_BOXED, _last), (_OFFICIAL_ANSWER_WORD, _first),
                          (_OFFICIAL_DOT, _last), (_OFFICIAL_BARE, _last)):
        letter = pick(pattern, text)
        if letter is not None:
            return letter
    return None


# The conclusion phrases the official local reward looks for in the reasoning when no letter
# pattern matched (a letter closing "so ...", "the answer is ...", "choose ...", "... is correct").
_OFFICIAL_CONCLUSIONS = (
    re.compile(r"(?:so|thus|in conclusion|the answer is|choose|select|option|answer)[^A-H]*([A-H])\b",
               re.IGNORECASE),
    re.compile(r"(?:the answer is|choose|select|option|answer)[^A-H]*([A-H])\b", re.IGNORECASE),
    re.compile(r"\b([A-H])\s+(?:is correct)\b", re.IGNORECASE),
)


def official_think_choice(think: str | None) -> str | None:
    """The letter the official local consistency reward (5-GPU script) takes from the
    policy's ``<think>`` text when its reference server gives no reply: the *last* match of
    the first of its letter patterns that matches (``$\\boxed{X}$``, "answer X", a letter
    followed by a dot, a standalone letter A-H in any case), else of its conclusion phrases;
    None when nothing matches. The standalone-letter pattern takes the article "a" too, so
    most reasoning in English yields a letter, often A."""
    text = think or ""
    for pattern in (_OFFICIAL_BOXED, _OFFICIAL_ANSWER_WORD, _OFFICIAL_DOT, _OFFICIAL_BARE, *_OFFICIAL_CONCLUSIONS):
        letter = _last(pattern, text)
        if letter is not None:
            return letter
    return None


def think_fallback_reward(think: str, policy_answer: str | float | None, answer_type: str = "choice") -> float:
    """The official local reward's score when its reference gives no reply: 1.0 when the
    letter read from the policy's own ``<think>`` text (``official_think_choice``) is the
    policy's answer, else 0.0. Only letters are compared: a numeric answer scores 0.0."""
    if answer_type == "number" or not isinstance(policy_answer, str):
        return 0.0
    letter = official_think_choice(think)
    return 1.0 if letter is not None and letter == policy_answer else 0.0


def official_eval_choice(completion: str | None) -> str | None:
    """The letter the official evaluation script reads: the first letter right after an
    ``<answer>`` tag, else the last letter followed by a dot anywhere; None where it reads
    none (counted wrong there, as here)."""
    text = (completion or "").strip()
    return _first(_OFFICIAL_ANSWER_TAG, text) or _last(_OFFICIAL_DOT, text)


def read_choice(completion: str | None, n_options: int | None = None,
                parser: ChoiceParser = "strict") -> str | None:
    """The option letter a completion gives, read the way ``parser`` says."""
    if parser == "strict":
        return parse_choice(extract_answer(completion or ""), n_options)
    if parser == "official_reward":
        return official_reward_choice(completion)
    if parser == "official_eval":
        return official_eval_choice(completion)
    raise ValueError(f"unknown answer parser {parser!r} (strict, official_reward, official_eval)")


def format_ok(completion: str | None, rule: AnswerParser = "strict") -> bool:
    """Whether a completion is in the ``<think>..</think><answer>..</answer>`` format:
    ``strict`` (this project's ``FORMAT_RE``: non-empty blocks, no nested or repeated tags,
    whitespace around allowed) or ``official`` (ms-swift's ``format`` reward)."""
    if rule == "official":
        return OFFICIAL_FORMAT_RE.match(completion or "") is not None
    if rule == "strict":
        return FORMAT_RE.match(completion or "") is not None
    raise ValueError(f"unknown format rule {rule!r} (strict or official)")
