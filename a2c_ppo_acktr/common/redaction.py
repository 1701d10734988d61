"""Secrets kept out of everything a run writes: config files, logs, messages and labels.

Three rules, each enforced where the value enters:

* A ``*_key_env`` setting names the environment variable that holds a key, never the key itself:
  :func:`key_env_problem` tells a key passed by mistake from a variable's name, so the config refuses
  it before anything is written.
* A URL's ``user:password@`` part and its credential-like query values (``?api_key=...``) are
  replaced by ``***`` in whatever is written (:func:`redact_urls`); the request itself still sends
  them (:func:`basic_auth`).
* A server's text (a reply, an error body) is redacted of every echo of a secret
  (:func:`redact_all`): as sent, cut off, spaced, percent-, JSON- or HTML-escaped, upper-cased,
  hex, or base64 at any alignment (the key inside a longer encoded header).
"""

from __future__ import annotations

import base64
import re
import urllib.parse
from functools import lru_cache
from typing import Any, Optional, Sequence

# A run of this many letters and digits of a secret (or of one of its encodings) is taken for an
# echo of it: servers truncate what they echo, so a cut-off key is redacted too.
MIN_ECHO = 8
MASK = "***"

# What a server or a model may put between the characters of an echoed secret: white space, line
# breaks (literal or JSON-escaped, as base64 is wrapped), zero-width characters and soft hyphens.
_GAP = r"(?:[\s\u00ad\u200b-\u200d\u2060\ufeff]|\\[nrt])*"

# Environment variable names as shells and POSIX write them.
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
# How the keys of common providers begin (OpenAI, Anthropic, Hugging Face, GitHub, Slack, AWS, Google,
# Groq, xAI, Perplexity); a variable's name never does.
_KEY_PREFIXES = re.compile(
    r"(?i)^(sk-|sk_|hf_|ghp_|gho_|ghs_|github_pat_|xox[abpors]-|akia|aiza|gsk_|xai-|pplx-|bearer\s)"
)
# Query parameters whose values are credentials.
_SECRET_PARAM = re.compile(r"(?i)(key|token|secret|passw|pwd|auth|sig|credential)")
_URL_START = re.compile(r"(?i)[a-z][a-z0-9+.\-]*://")
_URL_SPAN = re.compile(r"(?i)[a-z][a-z0-9+.\-]*://(?:(?!,\s*[a-z][a-z0-9+.\-]*://)\S)+")


def key_env_problem(value: str) -> Optional[str]:
    """Why ``value`` cannot be the name of an environment variable holding a key, or None.

    A key passed by mistake is refused without being repeated: the answer never contains ``value``.
    Besides names that no shell accepts (``sk-...``: a dash), a name-shaped value is taken for a key
    when it starts like a provider's key (``hf_...``) or has a part of 16 or more characters mixing
    digits with letters, or upper with lower case (variable names are words: ``OPENAI_API_KEY``).
    """
    text = value.strip()
    if not text:
        return "is empty"
    if not _ENV_NAME.fullmatch(text):
        return f"is not an environment variable's name ({len(text)} characters, not only letters, digits and _)"
    if _KEY_PREFIXES.match(text):
        return "starts like an API key, not like an environment variable's name"
    for part in text.split("_"):
        mixed = any(c.isdigit() for c in part) and any(c.isalpha() for c in part)
        cased = any(c.islower() for c in part) and any(c.isupper() for c in part)
        if len(part) >= 16 and (mixed or cased):
            return (
                "looks like an API key (a long run of mixed letters and digits), not like an environment variable's "
                "name"
            )
    return None


# ------------------------------------------------------------------------------------------ URLs
def redact_url(url: str) -> str:
    """``url`` with its ``user:password@`` part and credential-like query values replaced by ``***``
    (``http://***@host:8000/v1?api_key=***``); any other text is returned unchanged."""
    try:
        parts = urllib.parse.urlsplit(url)
    except ValueError:  # an unparseable "URL" (a bad port, brackets) may still hold a password
        return _redact_userinfo_text(url)
    netloc = parts.netloc
    if "@" in netloc:
        netloc = MASK + "@" + netloc.rpartition("@")[2]
    query = "&".join(_redact_param(p) for p in parts.query.split("&")) if parts.query else parts.query
    if (netloc, query) == (parts.netloc, parts.query):
        return url
    return urllib.parse.urlunsplit((parts.scheme, netloc, parts.path, query, parts.fragment))


def _redact_param(pair: str) -> str:
    name, eq, value = pair.partition("=")
    return f"{name}={MASK}" if eq and value and _SECRET_PARAM.search(urllib.parse.unquote_plus(name)) else pair


def _redact_userinfo_text(text: str) -> str:
    m = _URL_START.match(text)
    if not m or "@" not in text[m.end() :]:
        return text
    return text[: m.end()] + MASK + "@" + text[m.end() :].rpartition("@")[2]


def redact_urls(value: str) -> str:
    """Every URL in ``value`` redacted with :func:`redact_url`: a URL runs from its scheme to the next
    white space, or to a comma that starts another URL (``rollout.engine_url`` lists them so; a
    password may hold a comma itself). Text without ``://`` is returned unchanged."""
    if "://" not in value:
        return value
    return _URL_SPAN.sub(lambda m: redact_url(m.group(0)), value)


def redact_written(data: Any) -> Any:
    """A copy of a config's dict (nested dicts and lists) with every URL in its strings redacted."""
    if isinstance(data, str):
        return redact_urls(data)
    if isinstance(data, dict):
        return {k: redact_written(v) for k, v in data.items()}
    if isinstance(data, (list, tuple)):
        return type(data)(redact_written(v) for v in data)
    return data


def strip_credentials(url: str) -> str:
    """``url`` without its ``user:password@`` part (the address a request goes to, and names)."""
    parts = urllib.parse.urlsplit(url)
    if parts.username is None and parts.password is None:
        return url
    host = parts.netloc.rpartition("@")[2]
    return urllib.parse.urlunsplit((parts.scheme, host, parts.path, parts.query, parts.fragment))


def has_redacted_credentials(url: str) -> bool:
    """Whether ``url``'s user part is the ``***`` a written config holds in place of a password."""
    return urllib.parse.urlsplit(url).netloc.rpartition("@")[0] == MASK


def basic_auth(url: str) -> str:
    """``base64(user:password)`` of a URL with credentials (HTTP basic authentication), else ''."""
    parts = urllib.parse.urlsplit(url)
    if parts.username is None:
        return ""
    pair = f"{urllib.parse.unquote(parts.username)}:{urllib.parse.unquote(parts.password or '')}"
    return base64.b64encode(pair.encode("utf-8")).decode("ascii")


def url_secrets(url: str) -> list[str]:
    """What of ``url`` no text may contain: its password (as written and decoded) and the basic-auth
    value made of it."""
    password = urllib.parse.urlsplit(url).password or ""
    return [s for s in (password, urllib.parse.unquote(password), basic_auth(url)) if s]


# ------------------------------------------------------------------------------------------ echoes
def _char_spellings(ch: str) -> str:
    """A regex for one character as a server may echo it: itself, percent-encoded (its UTF-8 bytes),
    JSON-escaped (``\\uXXXX``, ``\\"``), or an HTML character reference."""
    code = ord(ch)
    alts = [
        re.escape(ch),
        "".join(f"%{b:02x}" for b in ch.encode("utf-8")),
        rf"\\u{code:04x}",
        f"&#0*{code};",
        f"&#x0*{code:x};",
    ]
    if ch == " ":
        alts.append(r"\+")
    if ch in '"\\/':
        alts.append(re.escape("\\" + ch))
    return "(?:" + "|".join(alts) + ")"


def _units(form: str) -> list[tuple[str, bool]]:
    """``(regex, counts)`` per character of ``form``: letters and digits count toward an echo;
    punctuation may also be left out (``sk test 7f3a...`` is ``sk-test-7f3a...`` spaced)."""
    out = []
    for ch in form:
        counts = ch.isalnum()
        out.append((_char_spellings(ch) if counts else f"(?:{_char_spellings(ch)})?", counts))
    return out


def _base64_forms(raw: bytes) -> list[str]:
    """The base64 text of ``raw`` on its own and inside any longer base64 text: for each of the three
    alignments, the characters that depend on ``raw``'s bytes only (standard and URL-safe alphabets)."""
    forms = [base64.b64encode(raw).decode("ascii"), base64.b64encode(b"Bearer " + raw).decode("ascii")]
    for r in range(3):
        enc = base64.b64encode(b"\0" * r + raw).decode("ascii")
        forms.append(enc[(8 * r + 5) // 6 : (8 * (r + len(raw))) // 6])
    forms += [f.translate(str.maketrans("+/", "-_")) for f in forms]
    return forms


@lru_cache(maxsize=64)
def _patterns(secret: str) -> tuple[tuple[re.Pattern, tuple[re.Pattern, ...]], ...]:
    """Per spelling of ``secret``: the regex of its first :data:`MIN_ECHO` counting characters, and
    one regex per later character that extends a match."""
    raw = secret.encode("utf-8")
    encoded = [f for f in _base64_forms(raw) + [raw.hex()] if len(f) >= MIN_ECHO]
    out = []
    for form in dict.fromkeys([secret, *encoded]):
        units = _units(form)
        # The echo starts at the first letter or digit (leading punctuation may be dropped).
        first = next((i for i, (_, c) in enumerate(units) if c), None)
        if first is None:
            units, first = [(re.escape(form), True)], 0
        units = units[first:]
        total = sum(c for _, c in units)
        need, head_len = min(MIN_ECHO, total), 0
        seen = 0
        for head_len, (_, counts) in enumerate(units, 1):
            seen += counts
            if seen >= need:
                break
        head = re.compile(_GAP.join(u for u, _ in units[:head_len]), re.IGNORECASE)
        tail = tuple(re.compile(f"{_GAP}({u})", re.IGNORECASE) for u, _ in units[head_len:])
        out.append((head, tail))
    return tuple(out)


def _echo_spans(text: str, secret: str) -> list[tuple[int, int]]:
    spans = []
    for head, tail in _patterns(secret):
        pos = 0
        while (m := head.search(text, pos)) is not None:
            end = at = m.end()
            for unit in tail:
                ext = unit.match(text, at)
                if ext is None:
                    break
                at = ext.end()
                if ext.group(1):  # a character, not only a gap before a dropped punctuation mark
                    end = at
            spans.append((m.start(), end))
            pos = max(end, m.start() + 1)
    return spans


def redact_all(text: str, secrets: Sequence[str]) -> str:
    """``text`` with every echo of each of ``secrets`` replaced by ``***`` (see the module docstring):
    whole or cut off after at least :data:`MIN_ECHO` letters and digits; empty secrets are ignored."""
    spans = sorted(span for s in secrets if s for span in _echo_spans(text, s))
    if not spans:
        return text
    out, at = [], 0
    for start, end in spans:
        if start < at:  # overlaps the previous echo: one mask for both
            if end > at:
                at = end
            continue
        out += [text[at:start], MASK]
        at = end
    return "".join(out) + text[at:]


def redact(text: str, secret: str) -> str:
    """``text`` with every echo of ``secret`` replaced by ``***`` (:func:`redact_all` of one secret)."""
    return redact_all(text, [secret])
