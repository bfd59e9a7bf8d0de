"""The run's own colocated engine as the judge (`--reward.judge-url self`): between the rollout and the update, the
policy reads the rubric and scores its own attempts, greedily (temperature 0), under vLLM's structured outputs.

    judge = SelfJudge(EngineBackend(engine, tok), max_tokens=1024)
    verdicts = run(judge_groups(judge, groups, "group", rubric_text))   # as with a server; judge.version: the weights

The schema it answers under leaves nothing open (`prompt.strict_schema`): every attempt id once, in order, each
explanation a bounded run of plain characters, each score a number in [0, 1]. Its longest answer fits the token
budget, so at temperature 0 every answer parses; only a prompt that leaves the answer too little room fails (its
group is masked, like any judge error). Self-judging can be gamed: see docs/judge.md.
"""

from __future__ import annotations

from nanosky.agent.backends import BackendError, EngineBackend, Request
from nanosky.judge.prompt import JudgeError, bounded_schema
from nanosky.rollout.chat import prompt_ids


class SelfJudge:
    """A judge `Call` over the rank's EngineBackend. `version` is the weight version it judged with (the trainer's,
    recorded with each score)."""

    def __init__(self, backend: EngineBackend, max_tokens: int = 1024):
        self.backend, self.tok, self.max_tokens = backend, backend.tok, max_tokens

    @property
    def version(self) -> int | None:
        return self.backend.version

    async def __call__(self, messages: list[dict], n: int | None) -> str:
        """The judgement of `n` attempts (None: one) under the strict schema, its explanations as long as the budget
        allows (the engine writes JSON with no free whitespace)."""
        ids = prompt_ids(self.tok, messages)  # rendered as every prompt of the run is
        room = self.backend.engine.cfg.max_model_len - len(ids)
        if room < self.max_tokens:  # the answer might not finish: say so rather than parse a cut-off one
            raise JudgeError(
                f"the judge's prompt ({len(ids)} tokens) leaves {max(room, 0)} of the {self.max_tokens} tokens its "
                f"answer may need (--engine.max-model-len {self.backend.engine.cfg.max_model_len})"
            )
        schema = bounded_schema(n, self.max_tokens)
        req = Request(
            messages, tools=None, max_tokens=self.max_tokens, temperature=0.0, prompt_ids=ids, json_schema=schema
        )
        try:
            out = await self.backend.generate(req)
        except BackendError as e:
            raise JudgeError(str(e)) from None
        if out.finish_reason == "length":
            raise JudgeError(f"the judge's answer ran past {self.max_tokens} tokens")
        return out.text
