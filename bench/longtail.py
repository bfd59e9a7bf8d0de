"""A long-tailed shape for the partial-rollout benchmark (`--plugins bench.longtail --env longtail_math`): text_math
problems whose episodes run a heavy-tailed number of turns. Episode `seed` answers `turns(seed)` times: after each
reply but the last, the env asks it to check its answer again; the last reply is graded as text_math grades it.

turns(seed) = min(8, floor(U^(-1/1.5))), U uniform on (0, 1] from the seed: a Pareto tail with index 1.5. P(1 turn) =
0.65, P(>= 2) = 0.35, P(>= 4) = 0.125, P(8) = 0.044; mean 1.8 turns. With `--rollout.ignore-eos` every turn is
`--rollout.max-new-tokens` long, so an episode's length is its turns times that: nobody tuned these numbers to a
model.
"""

from __future__ import annotations

import math
import random

import envs
from envs.base import Env, StepResult
from envs.text_math import TextMathEnv

MAX_TURNS = 8
ALPHA = 1.5


def turns(seed: int) -> int:
    u = 1.0 - random.Random(f"longtail-{seed}").random()  # (0, 1]
    return min(MAX_TURNS, math.floor(u ** (-1.0 / ALPHA)))


@envs.register_env("longtail_math")
class LongTailMath(Env):
    name = "longtail_math"
    max_turns = MAX_TURNS

    def __init__(self, split: str = "train", seed: int = 0, kinds=("logic",)):
        self.inner = TextMathEnv(split=split, seed=seed, kinds=tuple(kinds))
        self.left = turns(seed)

    def reset(self):
        return self.inner.reset()

    def step(self, action: str) -> StepResult:
        self.left -= 1
        if self.left > 0:
            return StepResult([{"role": "user", "content": "Check your answer once more."}], 0.0, False)
        return self.inner.step(action)
