"""TRL-style reward functions for tests/unit/test_ecosystem_rewards.py: `fn(prompts, completions, **columns)`."""

CALLS: list[dict] = []


def exact(prompts, completions, answer, **columns):
    """1.0 where the completion's text equals the row's answer; records what it was given."""
    CALLS.append({"prompts": prompts, "completions": completions, "answer": answer, **columns})
    texts = [c if isinstance(c, str) else c[0]["content"] for c in completions]
    return [float(t.strip() == a) for t, a in zip(texts, answer)]


def raises(prompts, completions, **columns):
    raise RuntimeError("the judge is down")


def short(prompts, completions, **columns):
    return [1.0] * (len(completions) - 1)


def unscored(prompts, completions, **columns):
    return [None if "skip" in (c if isinstance(c, str) else c[0]["content"]) else 0.5 for c in completions]
