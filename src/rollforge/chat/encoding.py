"""Injection-safe encoding of rendered chat text, for one tokenizer.

Text from datasets, environments and tools (system, user and tool contents) is escaped before the
chat template renders it: every special token's text in it becomes one private-use character
(Supplementary Private Use Area-A, one character per special token). ``encode`` turns each such
character back into the token's text tokenized as plain text, so only the template's own markup
becomes control tokens. The fallback tool descriptions rollforge writes itself are trusted (never
escaped): their call-format tokens are the tokens the model is to write.

Encoding goes through the Rust tokenizer when there is one (~2x faster than the Python wrapper, and
it never cleans up spaces), without character offsets where it can (~25% faster per call).
"""

from __future__ import annotations

import re
from typing import Any, Callable, Sequence

from ..errors import TemplateError

_ESCAPE_BASE = 0xF0000  # Supplementary Private Use Area-A: one character per special token
_ESCAPED = re.compile("([\U000f0000-\U000ffffd])")


class SafeEncoder:
    """Escapes outside text and encodes rendered text of ``tokenizer`` (see the module docstring)."""

    def __init__(self, tokenizer: Any):
        self.tokenizer = tokenizer
        self._fast = getattr(tokenizer, "backend_tokenizer", None)
        # Without character offsets (which rendering never reads) (tokenizers >= 0.20).
        self._encode_fast = getattr(self._fast, "encode_batch_fast", None)
        decoder = getattr(tokenizer, "added_tokens_decoder", None) or {}
        specials = {t.content for t in decoder.values() if getattr(t, "special", False)}
        specials |= set(getattr(tokenizer, "all_special_tokens", ()) or ())
        specials = sorted((s for s in specials if s), key=lambda s: (-len(s), s))
        self.control_token_ids = frozenset(tokenizer.convert_tokens_to_ids(specials)) if specials else frozenset()
        self._escape_of = {text: chr(_ESCAPE_BASE + i) for i, text in enumerate(specials)}
        self._special_of = {char: text for text, char in self._escape_of.items()}
        self._special_re = re.compile("|".join(map(re.escape, specials))) if specials else None
        self._escaped_ids: dict[str, list[int]] = {}
        self._trusted: list[str] = []  # fallback tool descriptions rollforge wrote

    def encode(self, text: str) -> list[int]:
        """Token ids of rendered text: special-token text is a control token, except where content
        was escaped, which is tokenized as plain text."""
        if _ESCAPED.search(text) is None:
            return self._encode_plain(text)
        ids: list[int] = []
        for i, piece in enumerate(_ESCAPED.split(text)):
            if i % 2 == 0:
                if piece:
                    ids += self._encode_plain(piece)
            else:
                ids += self._plain_special(piece)
        return ids

    def _encode_plain(self, text: str) -> list[int]:
        if self._encode_fast is not None:
            return self._encode_fast([text], add_special_tokens=False)[0].ids
        if self._fast is not None:
            return self._fast.encode(text, add_special_tokens=False).ids
        return self.tokenizer.encode(text, add_special_tokens=False)

    def _plain_special(self, char: str) -> list[int]:
        """The ids of an escaped special token's text tokenized as plain text (cached)."""
        ids = self._escaped_ids.get(char)
        if ids is None:
            text = self._special_of.get(char)
            if text is None:  # a private-use character rollforge did not put there
                ids = self._encode_plain(char)
            else:
                ids = self._split_encoder()(text)
                if self.control_token_ids.intersection(ids):
                    raise TemplateError(f"the tokenizer cannot encode {text!r} as plain text")
            self._escaped_ids[char] = ids
        return list(ids)

    def _split_encoder(self) -> Callable[[str], list[int]]:
        """Encodes with special tokens split into plain text, on a copy of the Rust tokenizer: the
        Python wrapper's ``split_special_tokens=True`` flips a flag on the shared one and leaves it."""
        if self._fast is None:
            return lambda text: list(self.tokenizer.encode(text, add_special_tokens=False, split_special_tokens=True))
        from tokenizers import Tokenizer

        splitting = Tokenizer.from_str(self._fast.to_str())
        splitting.encode_special_tokens = True
        return lambda text: splitting.encode(text, add_special_tokens=False).ids

    def escape(self, text: str) -> str:
        """``text`` with every special token's text replaced by its private-use escape, except in
        the trusted fallback tool descriptions (see ``trust``)."""
        if self._special_re is None or self._special_re.search(text) is None:
            return text
        for trusted in self._trusted:
            at = text.find(trusted)
            if at >= 0:
                return self.escape(text[:at]) + trusted + self.escape(text[at + len(trusted) :])
        return self._special_re.sub(lambda m: self._escape_of[m.group()], text)

    def unescape(self, text: str) -> str:
        """``text`` with every escape turned back into its special token's text."""
        if _ESCAPED.search(text) is None:
            return text
        return _ESCAPED.sub(lambda m: self._special_of.get(m.group(), m.group()), text)

    def decode(self, ids: Sequence[int]) -> str:
        if self._fast is not None:
            return self._fast.decode(list(ids), skip_special_tokens=False)
        return self.tokenizer.decode(list(ids), skip_special_tokens=False, clean_up_tokenization_spaces=False)

    def trust(self, fallback: str) -> str:
        """Remember a fallback tool description as rollforge's own text (never escaped)."""
        if fallback and fallback not in self._trusted:
            if len(self._trusted) >= 64:
                self._trusted.clear()
            self._trusted.append(fallback)
        return fallback
