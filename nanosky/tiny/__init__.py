"""The bundled tiny model: a ~2.5M-parameter Qwen2-architecture LM, its own tokenizer and chat template, warm-started
by supervised training on the project's own synthetic data. No network, deterministic from a seed.

    python -m nanosky.tiny                    # build if needed; prints the model directory on its last line
    python -m nanosky.tiny --force            # rebuild (the committed copy lives in nanosky/assets/tiny)
    python -m nanosky.tiny --variant agent    # the agent model (nanosky/assets/tiny-agent), see below
    python -m nanosky.tiny --variant tool     # the tool_use model (nanosky/assets/tiny-tool), see below
    python -m nanosky.tiny --variant swe      # the swe model's first stage (nanosky/assets/tiny-swe), see below

The warm start deliberately mixes three answer styles for text_math so that RL has something real to learn:
  think  — the worked steps, then <answer>N</answer>   (right most often)
  direct — <answer>N</answer> with no steps            (a tiny model guessing multi-digit sums is often wrong)
  plain  — "The answer is N." without the tag          (never rewarded: wrong format)
Sampling from the warm start lands in the 20–50 % range on held-out problems; GRPO can raise it by learning to
prefer the format that is rewarded and the style that is right, the way format and reasoning habits emerge in
R1-Zero-style training. Tool-use demonstrations (calculator / search / wiki / python calls) come from the tool_use
env's scripted expert.

The `agent` variant (`--model.path tiny-agent`, what the webshop_lite / alfworld_lite presets start from) is trained
from scratch with its own 2,048-token BPE, on examples rendered as `--rollout.mode stepwise` prompts them: each turn of
a noisy expert's episode (`step_noise` 0.25: a random admissible action in a quarter of the turns, so RL has
headroom), with the admissible actions shown, and the loss on that turn's action. Two builds trained on the actions
alone never copied entity names from the prompt (0 successes, docs/experiments/tiny_models.md). What made copying emerge here: language
modelling on the whole context as well (`lm_weight` 0.25: the room's receptacles are named in the observation and
again in the action list), and past observations without their stale action lists (`stepwise.window`). It does not
yet copy webshop's random product ids (`bench/agent_model_check.py`'s figures: docs/experiments/tiny_models.md).

The `tool` variant (`--model.path tiny-tool`, what the tool_use preset starts from) is trained from scratch on the
base model's tokenizer, on tool_use demonstrations and copy drills only, with 8 attention heads of 32 dims. Tool use
is mostly copying (the question's numbers into the call, the tool's output into the answer); the agent variant,
continued from a model that had learnt math by rote, wrote plausible arguments that ignored the question. Copying
digit strings is learnt late and suddenly (an induction-head phase change, after ~20k drills here), so this recipe
spends its whole budget on the one skill.

The `swe` variant (`--model.path tiny-swe`, what the swe preset starts from) is trained from scratch with a BPE of its
own data: 400 whole expert episodes of `envs.make("swe")` (tools run for real), 5,000 first turns of more episodes
built without the sandbox ((grep,) view, the fixing str_replace; the same turns the env shows), and drills that copy
numbered view lines into an old_str. It views the bug's file first in 100 / 100 held-out level-1 tasks and writes
the fix into a new_str in a third of them, but puts the memorised correct line (or some other line) into old_str
instead of copying the buggy one from the view, so it resolves none (`bench/swe_model_check.py`, docs/experiments/tiny_models.md). The
shipped `tiny-swe` is that build continued for 300 steps (5 min on 2 threads) on recovery turns: the recalled
old_str fails, the editor's error quotes the closest lines with their numbers, and `replace_lines` rewrites them
(`nanosky.tiny.swe_data`); it resolves 4 / 50 held-out level-1 tasks at T = 1:

    python -m nanosky.tiny --variant swe --out /tmp/tiny-swe-base        # from scratch (~46 min, 1 thread)
    python -m nanosky.tiny --variant swe --init /tmp/tiny-swe-base --n-swe 100 --n-swe-fix 1000 \
        --n-swe-recover 2000 --n-code-copy 500 --lr 3e-4 --steps 300 --steps2 0 --threads 2
"""

from __future__ import annotations

import hashlib
import json
import math
import random
import time
from dataclasses import asdict
from pathlib import Path

import torch

from nanosky.rollout.chat import encode, encode_conversation, prompt_ids, render
from nanosky.tiny.config import TinyConfig
from nanosky.tiny.data import conversations
from nanosky.tiny.tokenizer import build_tokenizer

ASSETS = Path(__file__).resolve().parents[1] / "assets"  # nanosky/assets: the committed builds
ASSET_DIR = ASSETS / "tiny"
AGENT_DIR = ASSETS / "tiny-agent"
TOOL_DIR = ASSETS / "tiny-tool"
SWE_DIR = ASSETS / "tiny-swe"
CACHE_DIR = Path.home() / ".cache" / "nanosky"


def _length_bucketed_batches(data: list, batch_size: int, rng: random.Random, batch_tokens: int = 0) -> list[list[int]]:
    """One epoch of batches of similar length (math turns are ~70 tokens, tool conversations ~200): sorting within
    shuffled chunks of 50 batches cuts padding without ordering the epoch by length. With `batch_tokens`, a batch
    also stops growing before its padded size (n x longest) would pass that many tokens."""
    order = list(range(len(data)))
    rng.shuffle(order)
    chunk = batch_size * 50
    batches = []
    for c in range(0, len(order), chunk):
        part = sorted(order[c : c + chunk], key=lambda i: len(data[i][0]))
        if not batch_tokens:
            batches += [part[i : i + batch_size] for i in range(0, len(part), batch_size)]
            continue
        cur: list[int] = []
        for i in part:  # ascending length: the newest member is the longest
            if cur and (len(cur) >= batch_size or (len(cur) + 1) * len(data[i][0]) > batch_tokens):
                batches.append(cur)
                cur = []
            cur.append(i)
        batches += [cur] if cur else []
    rng.shuffle(batches)
    return batches


def _encode(tok, example: tuple) -> tuple[list[int], list[int]]:
    """(messages, tool schemas) → ids and a loss mask on every assistant turn but those marked `"train": False`;
    (messages, None, "last") → on the last turn only (a step-wise example: the history's actions were sampled from
    other prompts)."""
    messages, schemas, *last = example
    ids, mask = encode_conversation(tok, messages, schemas)
    if last:
        head = len(prompt_ids(tok, messages[:-1], schemas))
        mask = [0] * head + mask[head:]
    # a turn marked "train": False is context, not a target (a mistake shown so that the next turn can recover)
    for i, m in enumerate(messages):
        if m["role"] == "assistant" and m.get("train") is False:
            a = len(prompt_ids(tok, messages[:i], schemas))
            b = len(encode(tok, render(tok, messages[: i + 1], schemas)))
            mask[a:b] = [0] * (b - a)
    return ids, mask


def _sft(model, tok, convs: list, rng: random.Random, steps: int, cfg: TinyConfig, t0: float) -> None:
    """Supervised training on assistant tokens only; AdamW, linear warm-up then cosine to 10 %."""
    # A conversation longer than the context is cut: its head is still a valid next-token example.
    data = [(ids[: cfg.max_len], mask[: cfg.max_len]) for ids, mask in (_encode(tok, c) for c in convs)]
    print(
        f"tiny: {sum(p.numel() for p in model.parameters()) / 1e6:.2f}M params, vocab {len(tok)}, "
        f"{len(data)} examples, {steps} steps",
        flush=True,
    )
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, betas=(0.9, 0.98), weight_decay=0.01)
    warm = max(1, steps // 20)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt,
        lambda s: min(1.0, (s + 1) / warm) * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, s / steps)))),
    )
    model.train()
    batches: list[list[int]] = []
    for step in range(steps):
        if not batches:
            batches = _length_bucketed_batches(data, cfg.batch_size, rng, cfg.batch_tokens)
        batch = [data[i] for i in batches.pop()]
        L = max(len(ids) for ids, _ in batch)
        ids = torch.full((len(batch), L), tok.pad_token_id)
        labels = torch.full((len(batch), L), -100)
        att = torch.zeros((len(batch), L), dtype=torch.long)
        for i, (x, m) in enumerate(batch):
            ids[i, : len(x)] = torch.tensor(x)
            att[i, : len(x)] = 1
            labels[i, : len(x)] = torch.where(torch.tensor(m) == 1, torch.tensor(x), -100)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=cfg.bf16):
            if cfg.lm_weight:
                loss = _weighted_lm_loss(model(input_ids=ids, attention_mask=att).logits, ids, att, labels, cfg)
            else:
                loss = model(input_ids=ids, attention_mask=att, labels=labels).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        opt.zero_grad(set_to_none=True)
        if step % 50 == 0 or step == steps - 1:
            print(f"tiny sft step {step:5d} loss {loss.item():.4f} ({time.time() - t0:.0f}s)", flush=True)


def _weighted_lm_loss(logits, ids, att, labels, cfg: TinyConfig) -> torch.Tensor:
    """Next-token cross-entropy on every real token, trained turns weighted 1 and the rest `cfg.lm_weight`."""
    # logits [B, L, V] predict position t+1 from t
    ce = torch.nn.functional.cross_entropy(
        logits[:, :-1].float().transpose(1, 2), ids[:, 1:], reduction="none"
    )  # [B, L-1]
    w = torch.where(labels[:, 1:] != -100, 1.0, cfg.lm_weight) * att[:, 1:]
    return (ce * w).sum() / w.sum()


def _model_dir(path: str) -> str:
    """`init` / `tokenizer` values: "tiny" = the bundled base model, else a model directory."""
    return str(ensure_tiny_model()) if path == "tiny" else path


def build(cfg: TinyConfig) -> Path:
    """Two stages: `steps` on fresh data from `seed`, then `steps2` more on new data from `seed + 1` with a fresh
    schedule (the committed model was made this way: the second pass is what taught it to copy numbers at all)."""
    from transformers import AutoTokenizer, Qwen2Config, Qwen2ForCausalLM

    t0 = time.time()
    # One intra-op thread: on a shared 2-core box OpenMP spin-waiting makes 2 threads much slower than 1.
    torch.set_num_threads(cfg.threads)
    out = Path(cfg.out) if cfg.out else ASSET_DIR
    convs, rng = conversations(cfg.n_math, cfg.n_tool, cfg.seed, cfg.n_agent, cfg.n_copy, cfg)
    if cfg.init:
        init = _model_dir(cfg.init)
        tok = AutoTokenizer.from_pretrained(init)
        model = Qwen2ForCausalLM.from_pretrained(init, dtype=torch.float32)
        # RoPE has no length limit of its own; the config's is what vLLM serves, so it follows the SFT context.
        model.config.max_position_embeddings = max(model.config.max_position_embeddings, cfg.max_len)
    else:
        if cfg.tokenizer:
            tok = AutoTokenizer.from_pretrained(_model_dir(cfg.tokenizer))
        else:  # BPE over the conversations' text (every message plus the tool schemas)
            corpus = [m["content"] for c in convs for m in c[0]] + [json.dumps(x) for c in convs if c[1] for x in c[1]]
            tok = build_tokenizer(corpus, cfg.vocab_size)
        model = Qwen2ForCausalLM(
            Qwen2Config(
                vocab_size=len(tok),
                hidden_size=cfg.hidden_size,
                intermediate_size=cfg.intermediate_size,
                num_hidden_layers=cfg.layers,
                num_attention_heads=cfg.heads,
                num_key_value_heads=cfg.kv_heads,
                max_position_embeddings=cfg.max_positions or cfg.max_len,
                tie_word_embeddings=True,
                rope_theta=10000.0,
                bos_token_id=None,
                eos_token_id=tok.eos_token_id,
                pad_token_id=tok.pad_token_id,
            )
        )
    if cfg.steps:  # 0 with --init: only the second stage runs, continuing from init
        _sft(model, tok, convs, rng, cfg.steps, cfg, t0)
    if cfg.steps2:
        with torch.no_grad():  # the first stage was saved in bf16 and reloaded when this recipe was found
            for p in model.parameters():
                p.copy_(p.to(torch.bfloat16).float())
        convs, rng = conversations(cfg.n_math2, cfg.n_tool2, cfg.seed + 1, cfg.n_agent2, cfg.n_copy2, cfg, stage=2)
        _sft(model, tok, convs, rng, cfg.steps2, cfg, t0)
    n_params = sum(p.numel() for p in model.parameters())

    out.mkdir(parents=True, exist_ok=True)
    model.generation_config.eos_token_id = tok.eos_token_id
    # bf16 on disk keeps the committed copy small; trainers load it as fp32.
    model.to(torch.bfloat16).save_pretrained(out, safe_serialization=True)
    # the tokenizer's limit is the model's context: below it, transformers warns of "indexing errors" on every
    # longer prompt (swe's and the agents' run past 512 tokens) though the model takes them
    tok.model_max_length = model.config.max_position_embeddings
    tok.save_pretrained(out)
    (out / "nanosky_tiny.json").write_text(
        json.dumps(
            {
                "config": asdict(cfg) | {"out": None, "force": False},
                "params": n_params,
                "build_s": round(time.time() - t0, 1),
            },
            indent=1,
        )
    )
    return out


def config_hash(cfg: TinyConfig) -> str:
    d = asdict(cfg) | {"out": None, "force": False}
    return hashlib.sha256(json.dumps(d, sort_keys=True).encode()).hexdigest()[:12]


def agent_config() -> TinyConfig:
    """The agent variant's recipe (see the module docstring): from scratch, step-wise noisy-expert turns with the
    actions shown, language modelling on their whole context, copy drills (its build time:
    docs/experiments/tiny_models.md)."""
    return TinyConfig(
        seed=11,
        vocab_size=2048,  # a BPE of this data: step prompts of ~340 tokens instead of ~660 with the base vocabulary
        heads=8,
        kv_heads=8,
        max_len=768,
        max_positions=1536,  # the concat mode of the agent envs still fits
        n_math=0,
        n_tool=600,
        n_copy=3000,
        n_steps=1500,
        n_action_copy=6000,
        lm_weight=0.25,
        steps=2100,
        steps2=0,
        batch_tokens=4096,
    )


def tool_config() -> TinyConfig:
    """The tool variant's recipe (see the module docstring): from scratch, tool_use demonstrations and copy drills
    only, 8 heads of 32 dims."""
    return TinyConfig(
        seed=7,
        tokenizer="tiny",
        heads=8,
        kv_heads=8,
        n_math=0,
        n_tool=6000,
        n_copy=12000,  # two thirds copy drills: with a third, copying had not started after 800 steps
        steps=1500,
        steps2=0,
    )


def swe_config() -> TinyConfig:
    """The swe variant's recipe (see the module docstring): from scratch with a BPE of its own data, whole expert
    episodes of the generated bug-fix tasks (find, view, str_replace, run the tests, submit) and code copy drills,
    language modelling on the file views as well."""
    return TinyConfig(
        seed=5,
        vocab_size=2048,
        heads=8,
        kv_heads=8,
        max_len=1536,
        n_math=0,
        n_tool=0,
        n_swe=400,
        n_swe_fix=5000,
        n_code_copy=3000,
        lm_weight=0.25,
        steps=2000,
        steps2=0,
        batch_size=16,
        batch_tokens=4096,
    )


VARIANTS = {
    "base": (TinyConfig, ASSET_DIR),
    "agent": (agent_config, AGENT_DIR),
    "tool": (tool_config, TOOL_DIR),
    "swe": (swe_config, SWE_DIR),
}


def built_model(variant: str = "base") -> Path | None:
    """The default recipe's model of `variant` if one exists (committed or built), without building it."""
    make_cfg, asset = VARIANTS[variant]
    if (asset / "model.safetensors").exists():
        return asset
    out = CACHE_DIR / f"tiny-{variant}-{config_hash(make_cfg())}"
    return out if (out / "model.safetensors").exists() else None


def ensure_tiny_model(cfg: TinyConfig | None = None, variant: str = "base") -> Path:
    """A bundled model's directory (`variant` "base" or "agent"): the committed copy if present, else built once
    into ~/.cache/nanosky."""
    make_cfg, asset = VARIANTS[variant]
    cfg = cfg or make_cfg()
    if cfg.out is None and not cfg.force and (asset / "model.safetensors").exists():
        return asset
    out = Path(cfg.out) if cfg.out else CACHE_DIR / f"tiny-{variant}-{config_hash(cfg)}"
    if cfg.force or not (out / "model.safetensors").exists():
        cfg.out = str(out)
        build(cfg)
    return out
