"""The bundled tiny models' recipe settings (`TinyConfig`): size, data mix, the build's schedule. A leaf, so the
recipe's data modules can name it without importing the build."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(kw_only=True)
class TinyConfig:
    seed: int = 0
    """Seed for data, tokenizer and init."""
    vocab_size: int = 1024
    hidden_size: int = 256
    layers: int = 4
    heads: int = 4
    kv_heads: int = 2
    intermediate_size: int = 768
    max_len: int = 512
    max_positions: int = 0
    """`max_position_embeddings` written to the config (0 = max_len): RoPE has no limit of its own, and vLLM
    refuses a `max_model_len` above it."""
    n_math: int = 70000
    """text_math SFT examples."""
    n_tool: int = 2000
    """tool_use demonstrations (0 = none)."""
    steps: int = 2200
    batch_size: int = 32
    lr: float = 1e-3
    """Higher rates (2e-3, 3e-3) or bf16 autocast left the model ignoring its context (a bigram-like model that
    cannot copy the question's numbers); 1e-3 in fp32 learns to copy (measured: 64 % exact digit copying after 400
    steps vs 22 % with bf16 at 2e-3)."""
    bf16: bool = False
    """bf16 autocast for the build (faster on AMX CPUs, but see `lr`)."""
    threads: int = 1
    """torch intra-op threads for the build."""
    steps2: int = 1300
    """Second stage: more steps on fresh data (0 = one stage)."""
    n_math2: int = 40000
    n_tool2: int = 500
    n_agent: int = 0
    """webshop_lite / alfworld_lite expert episodes (half each; cut at max_len tokens)."""
    n_copy: int = 0
    """Copy drills ("Repeat the text exactly."), see _copy_examples."""
    n_agent2: int = 0
    n_copy2: int = 0
    """Second-stage agent episodes and copy drills."""
    n_steps: int = 0
    """Step-wise webshop_lite / alfworld_lite episodes (half each, actions shown): every turn is one example, its
    prompt rendered as `--rollout.mode stepwise` renders it (`history_window` turns)."""
    step_noise: float = 0.25
    """Share of those turns where the demonstrator takes a random admissible action instead of the expert's (the
    expert re-plans from wherever that leads): the imitation is a noisy expert, so RL has headroom."""
    history_window: int = 2
    """The step-wise examples' history window (the agent presets' `--rollout.history-window`)."""
    n_action_copy: int = 0
    """Copy drills on admissible actions, product titles and ids of the two envs."""
    n_steps2: int = 0
    n_action_copy2: int = 0
    """Second-stage step-wise episodes and action copy drills."""
    n_swe: int = 0
    """`envs.make("swe")` expert episodes (levels 1, 1, 2 in turn; tools run for real in the sandbox, ~0.6 s each)."""
    n_swe_fix: int = 0
    """The first turns of swe expert episodes ((grep,) view, the fixing str_replace), built without the sandbox."""
    n_code_copy: int = 0
    """Copy drills on lines of generated package sources (the editor's old_str is copied from a file view)."""
    code_copy_mutate: float = 0.0
    """Share of those drills with one shown token changed at random (nanosky.tiny.swe_data: copying, not recall)."""
    n_swe_spot: int = 0
    """Spot-the-change turns: a task's first turns on a file with one random line change (nanosky.tiny.swe_data)."""
    n_swe_recover: int = 0
    """Recovery turns: a recalled old_str fails, the error quotes the buggy lines with their numbers, the next call
    replaces those lines (replace_lines; nanosky.tiny.swe_data)."""
    lm_weight: float = 0.0
    """Loss weight of every other token (prompts, observations, admissible lists) relative to the trained turns:
    > 0 adds language modelling on the whole context, where entity names repeat (the room's receptacles, then the
    same names in the action list), which is what builds copying heads; 0 = trained turns only."""
    batch_tokens: int = 0
    """Cap a batch's padded tokens (long episodes get smaller batches); 0 = always batch_size sequences."""
    tokenizer: str | None = None
    """From scratch but with this model directory's tokenizer instead of training one ("tiny" = the bundled base
    model's), so variants share one vocabulary."""
    init: str | None = None
    """Continue training from this model directory (keeps its tokenizer) instead of starting from scratch;
    "tiny" = the bundled base model."""
    out: str | None = None
    """Output directory (default: nanosky/assets/tiny)."""
    force: bool = False
    """Rebuild even if the output exists."""
