"""The model side of an eval: an in-process vLLM engine over a checkpoint, or any OpenAI-compatible chat server.

    model, tok, name = load_model(cfg)           # --ckpt → (Engine, tokenizer), --base-url → (OpenAIChat, None)
    trajs = rollout(model, tok, envs, cfg)       # list[nanosky.rollout.Trajectory], one per env, with tqdm
    close_model(model)

Engine episodes go through `nanosky.rollout.run_episodes` (token-in token-out, the same loop as training). Server
episodes run the same turn protocol over chat completions (stdlib urllib, no extra dependency) and carry the
server's token usage in `traj.info["usage"]`.
"""

from __future__ import annotations

import json
import os
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from tqdm import tqdm

from envs.base import Env
from evals.common import EvalConfig
from nanosky.rollout import RolloutConfig, Trajectory, run_episodes


class ApiError(RuntimeError):
    pass


class OpenAIChat:
    """A minimal chat-completions client. `tool_mode` decides how tool turns are sent (see EvalConfig)."""

    def __init__(self, base_url: str, model: str | None = None, api_key: str | None = None,
                 timeout_s: float = 300.0, tool_mode: str = "text", retries: int = 3):  # fmt: skip
        self.base_url = base_url.rstrip("/")
        self.api_key = api_key if api_key is not None else os.environ.get("OPENAI_API_KEY", "EMPTY")
        self.timeout_s, self.tool_mode, self.retries = timeout_s, tool_mode, retries
        self.model = model or self.list_models()[0]

    def _request(self, path: str, body: dict | None = None) -> dict:
        data = json.dumps(body).encode() if body is not None else None
        headers = {"Authorization": f"Bearer {self.api_key}", "Content-Type": "application/json"}
        for attempt in range(self.retries + 1):
            req = urllib.request.Request(self.base_url + path, data=data, headers=headers)
            try:
                with urllib.request.urlopen(req, timeout=self.timeout_s) as r:
                    return json.loads(r.read().decode())
            except urllib.error.HTTPError as e:
                detail = e.read().decode(errors="replace")[:500]
                if e.code in (429, 500, 502, 503) and attempt < self.retries:  # transient: back off and retry
                    time.sleep(2**attempt)
                    continue
                raise ApiError(f"HTTP {e.code} from {path}: {detail}") from None
            except (urllib.error.URLError, TimeoutError, ConnectionError) as e:
                if attempt < self.retries:
                    time.sleep(2**attempt)
                    continue
                raise ApiError(f"cannot reach {self.base_url}{path}: {e}") from None
        raise ApiError("unreachable")

    def list_models(self) -> list[str]:
        models = [m["id"] for m in self._request("/models").get("data", [])]
        if not models:
            raise ApiError(f"{self.base_url}/models lists no model; pass --model")
        return models

    def chat(self, messages: list[dict], max_tokens: int, temperature: float, seed: int | None = None,
             tools: list[dict] | None = None) -> tuple[str, dict, str]:  # fmt: skip
        """(assistant text, usage {"prompt_tokens", "completion_tokens"}, finish_reason)."""
        body: dict[str, Any] = {"model": self.model, "messages": api_messages(messages, tools, self.tool_mode),
                                "max_tokens": max_tokens, "temperature": temperature}  # fmt: skip
        if seed is not None:
            body["seed"] = seed
        if tools and self.tool_mode == "native":
            body["tools"], body["tool_choice"] = tools, "none"  # the template shows them; we parse the text
        out = self._request("/chat/completions", body)
        try:
            choice = out["choices"][0]
            msg = choice["message"]
        except (KeyError, IndexError, TypeError):
            raise ApiError(f"malformed response: {str(out)[:300]}") from None
        text = msg.get("content") or ""
        for call in msg.get("tool_calls") or []:  # a server that parsed calls anyway: back to the text form
            fn = call.get("function", {})
            text += f'<tool_call>{{"name": {json.dumps(fn.get("name"))}, "arguments": {fn.get("arguments") or "{}"}}}</tool_call>'
        usage = out.get("usage") or {}
        return text, {"prompt_tokens": int(usage.get("prompt_tokens") or 0),
                      "completion_tokens": int(usage.get("completion_tokens") or 0)}, choice.get("finish_reason") or "stop"  # fmt: skip


def tools_text(tools: list[dict]) -> str:
    """Tool list for the system prompt in "text" mode, in the compact form the bundled chat template uses."""
    lines = ["# Tools"]
    for t in tools:
        f = t.get("function", t)
        lines.append(
            f"- {f['name']}({', '.join(f.get('parameters', {}).get('properties', {}))}): {f.get('description', '')}"
        )
    lines.append('Call: <tool_call>{"name": ..., "arguments": {...}}</tool_call>')
    return "\n".join(lines)


def api_messages(messages: list[dict], tools: list[dict] | None, mode: str) -> list[dict]:
    """Env messages → chat-completions messages. "text": tool results become user turns (consecutive user turns
    merged, for templates that insist on alternation) and tools are listed in the system prompt. "native": role
    "tool" kept (with the id servers expect)."""
    if mode == "native":
        return [
            {**m, "tool_call_id": f"call_{i}"} if m["role"] == "tool" else dict(m)
            for i, m in enumerate(messages)
        ]
    out: list[dict] = []
    for m in messages:
        role, content = m["role"], str(m.get("content", ""))
        if role == "tool":
            role, content = "user", f"<tool_response>{content}</tool_response>"
        if out and out[-1]["role"] == role == "user":
            out[-1]["content"] += "\n" + content
        else:
            out.append({"role": role, "content": content})
    if tools:
        if out and out[0]["role"] == "system":
            out[0]["content"] += "\n" + tools_text(tools)
        else:
            out.insert(0, {"role": "system", "content": tools_text(tools)})
    return out


def _schemas(env: Env) -> list[dict] | None:
    return [t.schema for t in getattr(env, "tools", None) or []] or None


def api_episode(client: OpenAIChat, env: Env, cfg: EvalConfig, seed: int | None = None) -> Trajectory:
    """One episode against a chat server, with the agent loop's stop rules (done / max_turns / max_tokens)."""
    t = Trajectory(ids=[], loss_mask=[], logprobs=[], prompt_len=0)
    usage = {"prompt_tokens": 0, "completion_tokens": 0}
    t.info["usage"] = usage
    try:
        t.messages = list(env.reset())
    except Exception as e:  # noqa: BLE001 - one broken env costs its own episode only
        t.stop_reason, t.info["error"] = "env_error", repr(e)[:300]
        return t
    tools = _schemas(env)
    max_turns = cfg.max_steps or getattr(env, "max_turns", 1)
    for turn in range(1, max_turns + 1):
        try:
            text, u, finish = client.chat(t.messages, cfg.max_new_tokens, cfg.temperature, seed, tools)
        except ApiError as e:
            t.stop_reason, t.info["error"] = "api_error", str(e)
            break
        usage["prompt_tokens"] += u["prompt_tokens"]
        usage["completion_tokens"] += u["completion_tokens"]
        t.messages.append({"role": "assistant", "content": text})
        t.turns = turn
        try:
            res = env.step(text)
        except Exception as e:  # noqa: BLE001
            t.stop_reason, t.info["error"] = "env_error", repr(e)[:300]
            break
        # Bookkeeping as in nanosky.rollout: info keys overwrite, per-turn "calls" add up, counts are cumulative.
        t.turn_rewards.append(float(res.reward))
        t.info.update({k: v for k, v in res.info.items() if k not in ("calls", "usage")})
        t.info.setdefault("calls", []).extend(res.info.get("calls", []))
        t.tool_calls = int(res.info.get("tool_calls", t.tool_calls))
        t.invalid_tool_calls = int(res.info.get("invalid_calls", t.invalid_tool_calls))
        if res.done:
            t.stop_reason = "done"
        elif turn >= max_turns:
            t.stop_reason = "max_turns"
        elif finish == "length":
            t.stop_reason = "max_tokens"
        else:
            t.messages += res.observations
            continue
        break
    t.reward = float(sum(t.turn_rewards))
    t.success = bool(t.info.get("success", False))
    return t


def rollout(model, tok, envs: list[Env], cfg: EvalConfig, desc: str = "eval") -> list[Trajectory]:
    """Every env played to the end by `model` (an Engine or an OpenAIChat); trajectories in env order."""
    if isinstance(model, OpenAIChat):
        seeds = [cfg.seed + i for i in range(len(envs))]
        with ThreadPoolExecutor(cfg.concurrency) as pool, tqdm(total=len(envs), desc=desc) as bar:
            futures = [pool.submit(api_episode, model, e, cfg, s) for e, s in zip(envs, seeds)]
            for f in futures:
                f.add_done_callback(lambda _: bar.update(1))
            return [f.result() for f in futures]
    rc = RolloutConfig(
        max_new_tokens=cfg.max_new_tokens, max_total_tokens=cfg.max_model_len, max_turns=cfg.max_steps
    )
    # Greedy eval: RolloutConfig only validates sampling temperatures (> 0) and vLLM raises tiny ones to 0.01, so
    # 0 is set after validation; run_episodes hands it to vLLM, which then decodes greedily.
    rc.temperature = cfg.temperature
    trajs: list[Trajectory] = []
    with tqdm(total=len(envs), desc=desc) as bar:
        for i in range(0, len(envs), cfg.batch_size):
            chunk = envs[i : i + cfg.batch_size]
            trajs += run_episodes(model, tok, chunk, rc)
            bar.update(len(chunk))
    return trajs


def load_model(cfg: EvalConfig) -> tuple[Any, Any, str]:
    """(model, tokenizer or None, name) for --ckpt or --base-url."""
    if cfg.base_url:
        client = OpenAIChat(cfg.base_url, cfg.model, tool_mode=cfg.api_tool_mode)
        return client, None, client.model
    if not cfg.ckpt:
        raise SystemExit(
            "give the model: --ckpt PATH (HF checkpoint dir) or --base-url URL (OpenAI-compatible)"
        )
    from nanosky.policy import resolve_model_path

    cfg.ckpt = resolve_model_path(cfg.ckpt)  # "tiny" / "tiny-agent" / "tiny-tool" = the bundled models
    if not os.path.isdir(cfg.ckpt):
        raise SystemExit(f"--ckpt {cfg.ckpt}: no such directory")
    from transformers import AutoTokenizer

    from nanosky import dist
    from nanosky.engine import Engine, EngineConfig

    info = dist.init_distributed()
    engine = Engine(EngineConfig(max_model_len=cfg.max_model_len, seed=cfg.seed), cfg.ckpt, info)
    return engine, AutoTokenizer.from_pretrained(cfg.ckpt), cfg.ckpt


def close_model(model) -> None:
    if not isinstance(model, OpenAIChat) and model is not None:
        from nanosky import dist

        dist.shutdown()
