"""Keeping finished requests' KV caches for the requests that continue them (multi-turn episodes).

An episode's next request is its previous prompt, the tokens generated for it, the template's
closing text and the new observation: everything but the tail was already computed. When a row
finishes, its keys and values (prompt plus generated tokens but the last, which was never fed to
the model) are stored under those token ids. A new request whose prompt starts with stored ids
*takes* that entry (an episode continues once) and prefills only the rest.

Lookup checks every stored length (longest first) by slicing the prompt and hashing the slice, so
a hit is an exact token-id prefix match, never a guess. Entries are evicted least recently stored
first when the total size passes ``max_bytes``.
"""

from __future__ import annotations

import collections
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class CachedPrefix:
    ids: tuple[int, ...]
    layers: tuple[tuple[torch.Tensor, torch.Tensor], ...]  # per layer keys/values (H_kv, L, D)

    @property
    def nbytes(self) -> int:
        return sum(k.nbytes + v.nbytes for k, v in self.layers)


class PrefixStore:
    """Stored caches by their token ids; equal ids (two identical episodes) are kept side by side."""

    def __init__(self, max_bytes: int):
        self.max_bytes = max_bytes
        self._entries: collections.OrderedDict[int, CachedPrefix] = collections.OrderedDict()  # by age
        self._by_ids: dict[tuple[int, ...], list[int]] = {}
        self._lengths: collections.Counter[int] = collections.Counter()
        self._bytes = 0
        self._serial = 0

    def __len__(self) -> int:
        return len(self._entries)

    def put(self, prefix: CachedPrefix) -> None:
        if self.max_bytes <= 0 or not prefix.ids or prefix.nbytes > self.max_bytes:
            return
        self._serial += 1
        self._entries[self._serial] = prefix
        self._by_ids.setdefault(prefix.ids, []).append(self._serial)
        self._lengths[len(prefix.ids)] += 1
        self._bytes += prefix.nbytes
        while self._bytes > self.max_bytes:
            self._drop(next(iter(self._entries)))

    def take(self, prompt: tuple[int, ...]) -> CachedPrefix | None:
        """The longest stored entry whose ids are a proper prefix of ``prompt``, removed."""
        for length in sorted((n for n in self._lengths if n < len(prompt)), reverse=True):
            serials = self._by_ids.get(prompt[:length])
            if serials:
                return self._drop(serials[0])
        return None

    def clear(self) -> None:
        self._entries.clear()
        self._by_ids.clear()
        self._lengths.clear()
        self._bytes = 0

    def _drop(self, serial: int) -> CachedPrefix:
        prefix = self._entries.pop(serial)
        serials = self._by_ids[prefix.ids]
        serials.remove(serial)
        if not serials:
            del self._by_ids[prefix.ids]
        self._bytes -= prefix.nbytes
        self._lengths[len(prefix.ids)] -= 1
        if not self._lengths[len(prefix.ids)]:
            del self._lengths[len(prefix.ids)]
        return prefix
