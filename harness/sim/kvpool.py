"""The simulated server's KV pool: a GPU tier of fixed capacity and, with HiCache, a host tier.

Entries are prefix-chain hashes (see cache.py) with the tokens each adds. The GPU tier is an
LRU radix-like cache: inserting a prompt touches its entries leaf first, so parents end up more
recent than children and eviction eats sessions from their tail, as a radix cache does.
Entries of running requests are pinned (locked) and never evicted. The engine admits a
request only when its pinned prompt fits beside the running ones' (engine.py ``admit``), so the
pool overcommits only for a prompt larger than the whole tier, running alone.

What an evicted entry becomes depends on HiCache:

* ``hicache=on``: it moves to the host tier (``host_ratio`` x the GPU capacity, LRU). A later
  request whose prefix is there *loads it back* into the GPU tier, layer by layer: this is the
  window in which the incident's race lives (see faults.py).
* ``hicache=off``: it is gone; a later request recomputes those tokens (a longer prefill).

``admit(prompt)`` answers, for one request: the tokens found on the GPU, the tokens loaded
back from the host, and the tokens to compute; it inserts and (optionally) pins the prompt.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

from harness.sim.cache import Prompt, refresh


@dataclass(frozen=True)
class Admission:
    """What the pool did for one request's prompt."""

    gpu_tokens: int  # prefix tokens found on the GPU tier
    loaded_tokens: int  # prefix tokens loaded back from the host tier
    computed_tokens: int  # the rest: prefilled from scratch

    @property
    def cached_tokens(self) -> int:
        """Tokens the server reports as cached (found on either tier)."""
        return self.gpu_tokens + self.loaded_tokens


@dataclass
class PoolCounters:
    evicted_tokens: int = 0  # tokens evicted from the GPU tier
    dropped_tokens: int = 0  # tokens that left the pool for good (host full, or no host tier)
    loadbacks: int = 0  # requests that loaded part of their prefix back from the host
    loaded_tokens: int = 0
    recomputed_tokens: int = 0  # computed tokens of prefixes the pool had seen and lost
    overcommitted: int = 0  # requests admitted while pinned tokens exceeded the capacity


class KVPool:
    """GPU tier (``capacity`` tokens) plus an optional host tier (``host_capacity`` tokens)."""

    def __init__(self, capacity: int, host_capacity: int = 0) -> None:
        self.capacity = capacity
        self.host_capacity = host_capacity
        self.gpu: OrderedDict[bytes, int] = OrderedDict()
        self.host: OrderedDict[bytes, int] = OrderedDict()
        self.gpu_tokens = 0
        self.host_tokens = 0
        self.pinned_tokens = 0
        self._locks: dict[bytes, int] = {}
        self._seen: dict[bytes, None] = {}  # every entry ever inserted (bounded), for counters
        self.counters = PoolCounters()

    def __len__(self) -> int:
        return len(self.gpu)

    # ------------------------------------------------------------------ queries

    def match(self, prompt: Prompt) -> Admission:
        """Where the prompt's prefix is, without changing anything."""
        gpu = loaded = 0
        chain, tokens = prompt.chain, prompt.tokens
        i = 0
        for i in range(len(chain)):  # noqa: B007 - i is used after the loop
            key = chain[i]
            if key in self.gpu:
                gpu += tokens[i]
            elif key in self.host:
                loaded += tokens[i]
            else:
                break
        else:
            i = len(chain)
        hit = prompt.cumulative[i - 1] if i > 0 else 0
        return Admission(gpu, loaded, prompt.total - hit)

    def cached_tokens(self, prompt: Prompt) -> int:
        return self.match(prompt).cached_tokens

    def pin_cost(self, prompt: Prompt) -> int:
        """Tokens that pinning ``prompt`` would add (a prefix pinned by others counts once)."""
        locks = self._locks
        return sum(
            n for key, n in zip(prompt.chain, prompt.tokens, strict=True) if key not in locks
        )

    # ------------------------------------------------------------------ changes

    def admit(self, prompt: Prompt, pin: bool = False) -> Admission:
        """Load back what the host has, insert the rest, pin the prompt's entries if asked."""
        found = self.match(prompt)
        if found.loaded_tokens:
            self.counters.loadbacks += 1
            self.counters.loaded_tokens += found.loaded_tokens
            for key in prompt.chain:  # write-through: the host keeps its copy
                if key in self.host:
                    self.host.move_to_end(key)
        if found.computed_tokens:
            known = sum(
                n for key, n in zip(prompt.chain, prompt.tokens, strict=True) if key in self._seen
            )
            self.counters.recomputed_tokens += max(0, known - found.cached_tokens)
        if pin:
            if self.pinned_tokens > self.capacity:
                self.counters.overcommitted += 1
            self.pin(prompt.chain, prompt.tokens)
        self.insert(prompt)
        return found

    def insert(self, prompt: Prompt) -> None:
        """Put every prefix of ``prompt`` on the GPU tier, parents most recent; then evict."""
        for key, n in refresh(self.gpu, prompt):
            self.gpu_tokens += n
            if key not in self._seen:
                self._seen[key] = None
                if len(self._seen) > 1_000_000:
                    del self._seen[next(iter(self._seen))]
        self._evict()

    def pin(self, keys: tuple[bytes, ...], tokens: tuple[int, ...]) -> None:
        for key, n in zip(keys, tokens, strict=True):
            count = self._locks.get(key, 0)
            if count == 0:
                self.pinned_tokens += n
            self._locks[key] = count + 1

    def unpin(self, keys: tuple[bytes, ...], tokens: tuple[int, ...]) -> None:
        """The request finished: its entries become the most recent (leaf first), unpinned."""
        for key in reversed(keys):
            if key in self.gpu:
                self.gpu.move_to_end(key)
        for key, n in zip(keys, tokens, strict=True):
            count = self._locks.get(key, 0)
            if count <= 1:
                if count == 1:
                    self.pinned_tokens -= n
                self._locks.pop(key, None)
            else:
                self._locks[key] = count - 1
        self._evict()

    def flush(self) -> None:
        self.gpu.clear()
        self.host.clear()
        self.gpu_tokens = self.host_tokens = 0
        # pinned entries of requests still running come back when they are re-inserted
        self._seen.clear()

    # ------------------------------------------------------------------ eviction

    def _evict(self) -> None:
        """Evict least recently used unpinned entries until the GPU tier fits its capacity."""
        gpu = self.gpu
        budget = len(gpu)  # each entry is looked at most once per call
        while self.gpu_tokens > self.capacity and gpu and budget > 0:
            budget -= 1
            key, n = gpu.popitem(last=False)
            if key in self._locks:  # in use: it is as recent as it gets
                gpu[key] = n
                continue
            self.gpu_tokens -= n
            self.counters.evicted_tokens += n
            self._to_host(key, n)

    def _to_host(self, key: bytes, n: int) -> None:
        if self.host_capacity <= 0:
            self.counters.dropped_tokens += n
            return
        host = self.host
        if key in host:
            host.move_to_end(key)
        else:
            host[key] = n
            self.host_tokens += n
        while self.host_tokens > self.host_capacity and host:
            _, m = host.popitem(last=False)
            self.host_tokens -= m
            self.counters.dropped_tokens += m
