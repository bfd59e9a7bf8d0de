"""`--reward.judge`'s checks: a judge that can answer (its host reachable) and an env it can score."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from nanosky.config import TrainConfig

from nanosky.preflight.errors import UsageError
from nanosky.preflight.model import _connect


def check_judge(cfg: TrainConfig) -> None:
    """--reward.judge-url: a server answers there (any HTTP status: it may want a key), before a run whose every group
    would be masked; `self`: a judgement of a whole group fits its token budget, and the budget the context."""
    r = cfg.reward
    if not _has_checker(cfg.env) and (r.judge == "off" or not r.judge_only):
        raise UsageError(
            f"--env {cfg.env} has no checker: its reward is always 0, so only a judge can score it. Train it "
            "with --reward.judge group --reward.judge-url URL|self --reward.judge-only"
        )
    if r.judge == "off":
        return
    from nanosky.judge import SEPARATOR_SLACK
    from nanosky.judge.prompt import JudgeError, bounded_schema

    try:  # one judgement of a whole group must fit the budget, whoever judges (a server may add spaces)
        bounded_schema(
            cfg.rollout.group_size if r.judge == "group" else None,
            r.judge_max_tokens,
            slack=0 if r.judge_url == "self" else SEPARATOR_SLACK,
        )
    except JudgeError as e:
        raise UsageError(str(e)) from None
    if r.judge_url == "self":
        if r.judge_max_tokens >= cfg.engine.max_model_len:
            raise UsageError(
                f"--reward.judge-max-tokens {r.judge_max_tokens} leaves no room for the judge's prompt in "
                f"--engine.max-model-len {cfg.engine.max_model_len}"
            )
        return
    from urllib.parse import urlparse

    u = urlparse(r.judge_url)
    if u.scheme not in ("http", "https") or not u.hostname:
        raise UsageError(
            f"--reward.judge-url {r.judge_url}: not an http(s) URL (e.g. http://127.0.0.1:8001/v1) or self"
        )
    if e := _connect(u.hostname, u.port or (443 if u.scheme == "https" else 80), timeout_s=5):
        raise UsageError(f"--reward.judge-url {r.judge_url}: no server answers there ({e})")


def _has_checker(env: str) -> bool:
    import envs

    try:
        return envs.has_checker(env)
    except KeyError:  # an unknown env is check_env's to report
        return True
