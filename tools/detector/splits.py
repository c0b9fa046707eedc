"""The corpus's splits: a whole group in one split, chosen by a hash of its name."""

from __future__ import annotations

import hashlib

SPLITS = (("ngram", 0.35), ("train", 0.35), ("val", 0.15), ("test", 0.15))


def split_of(group: str) -> str:
    h = int(hashlib.sha1(group.encode()).hexdigest()[:8], 16) / 2**32
    acc = 0.0
    for name, share in SPLITS:
        acc += share
        if h < acc:
            return name
    return SPLITS[-1][0]
