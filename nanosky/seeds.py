"""One seed-derivation rule for data, sampling and evals: a seed is a hash of where it is used.

    derive_seed(cfg.seed, step, rnd, j)            # the env seed of prompt j in generation round rnd of a step
    derive_seed(sample_seed, episode, turn)        # the sampling seed of one engine request

Hashing the position (not adding offsets) keeps seeds independent across steps, ranks and episodes, and makes them
a pure function of the position, so a resumed run draws the same data and the same tokens.
"""

from __future__ import annotations

import hashlib

MAX_SEED = 2**31 - 1  # vLLM and torch take seeds below this


def derive_seed(*parts: int | str) -> int:
    h = hashlib.blake2b("/".join(map(str, parts)).encode(), digest_size=8).digest()
    return int.from_bytes(h, "little") % MAX_SEED
