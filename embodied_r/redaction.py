"""Secrets kept out of every error text: the keys this process sends, the variables that hold
them, and the shapes keys usually have (``redact``)."""

from __future__ import annotations

import json
import os
import re
import threading

# Things that look like credentials, in the forms servers echo them back.
_SECRET_PATTERNS = [
    # "Authorization: Bearer xyz", "bearer xyz", "Basic xyz"
    re.compile(r"(?i)\b(bearer|basic)\s+[A-Za-z0-9._~+/=\-]{4,}"),
    # Keys by their well-known prefixes (OpenAI, Anthropic, HF, GitHub, AWS, Google).
    re.compile(r"\b(sk-[A-Za-z0-9_\-]{8,}|sk_[A-Za-z0-9_\-]{8,}|hf_[A-Za-z0-9]{8,}|gh[pousr]_[A-Za-z0-9]{8,}"
               r"|AKIA[0-9A-Z]{12,}|AIza[0-9A-Za-z_\-]{20,}"
               # JSON web tokens: base64url header and payload, both JSON objects ("eyJ").
               r"|eyJ[A-Za-z0-9_\-]{8,}\.eyJ[A-Za-z0-9_\-]{8,}\.[A-Za-z0-9_\-]*)"),
    # key=value / "api_key": "value" pairs whose name says they are secret.
    re.compile(r"(?i)([\"']?\b(?:api[_-]?key|x-api-key|access[_-]?token|auth[_-]?token|secret|password|token)"
               r"[\"']?\s*[:=]\s*[\"']?)([^\s\"',;}&]{4,})"),
]

REDACTED = "[REDACTED]"

# Shorter values are too likely to be ordinary words ("test", a placeholder) to be masked
# wherever they occur; no real API key is this short.
MIN_SECRET_LENGTH = 8
_secret_values: set[str] = set()
_secret_envs: set[str] = set()
_secrets_lock = threading.Lock()


def register_secret(value: str | None) -> None:
    """A credential this process sends (an API key, an ``Authorization`` value), redacted from now on."""
    value = (value or "").strip()
    if len(value) >= MIN_SECRET_LENGTH:
        with _secrets_lock:
            _secret_values.add(value)


def register_secret_env(name: str | None) -> None:
    """A variable that holds a credential, its value redacted at each call: every backend config
    registers its own, so a process that only reports an error knows the keys its stages send."""
    if name:
        with _secrets_lock:
            _secret_envs.add(name)


def _redact_values(text: str) -> str:
    from urllib.parse import quote

    with _secrets_lock:
        values = _secret_values | {v for v in ((os.environ.get(n) or "").strip() for n in _secret_envs)
                                   if len(v) >= MIN_SECRET_LENGTH}
    for value in sorted(values, key=len, reverse=True):  # a key that contains another is masked whole
        # As sent, and as a server may echo it inside a URL or a JSON string.
        for form in {value, quote(value, safe=""), json.dumps(value)[1:-1]}:
            if form in text:
                text = text.replace(form, REDACTED)
    return text


def redact(text: str | None) -> str | None:
    """``text`` without the credentials known and anything shaped like a bearer token or a key:
    applied to every error text stored or printed, as a server may echo the key it was sent."""
    if not text:
        return text
    text = _redact_values(text)
    out = _SECRET_PATTERNS[0].sub(lambda m: f"{m.group(1)} {REDACTED}", text)
    out = _SECRET_PATTERNS[1].sub(REDACTED, out)
    out = _SECRET_PATTERNS[2].sub(lambda m: m.group(1) + REDACTED, out)
    return out
