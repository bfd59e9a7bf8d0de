"""Run logging on rank 0: TensorBoard scalars + text samples, rollouts.jsonl, tqdm; other ranks log nothing."""

from __future__ import annotations

import json
import os
import shutil
import sys
from typing import Any


def command(name: str) -> str:
    """How to call the `name` executable that sits beside this Python (the venv's `tensorboard`, `python`): bare
    when that one is first on PATH (an activated venv), else by its path (`.venv/bin/tensorboard`), so a printed
    command works right after `make demo` without activating anything."""
    path = os.path.join(os.path.dirname(sys.executable), name)
    if shutil.which(name) == path or not os.path.exists(path):
        return name
    rel = os.path.relpath(path)
    return rel if not rel.startswith("..") else path


class RunLogger:
    def __init__(self, run_dir: str, enabled: bool, total_steps: int, use_tqdm: bool = True):
        self.enabled = enabled
        self.run_dir = run_dir
        self.tb = self.bar = self.samples = None
        if not enabled:
            return
        from torch.utils.tensorboard import SummaryWriter

        os.makedirs(run_dir, exist_ok=True)
        self.tb = SummaryWriter(run_dir)
        self.samples = open(os.path.join(run_dir, "rollouts.jsonl"), "a")
        if use_tqdm:
            from tqdm import tqdm

            self.bar = tqdm(total=total_steps, desc="train", dynamic_ncols=True)

    def scalars(self, step: int, values: dict[str, float]) -> None:
        if not self.enabled:
            return
        for k, v in values.items():
            self.tb.add_scalar(k, v, step)
        self.tb.flush()

    def rollouts(self, step: int, trajs: list, tok, n: int, tag: str = "train", tokens: list | None = None) -> None:
        """The first n of `trajs` to rollouts.jsonl, each with its per-token values where `tokens` has them
        (`nanosky.trace`), and two of them to TensorBoard's text tab."""
        if not self.enabled or n <= 0:
            return
        for i, t in enumerate(trajs[:n]):
            rec = {"step": step, "split": tag} | t.to_json(with_ids=False)
            if tokens is not None and tokens[i] is not None:
                rec["tokens"] = tokens[i]
            self.samples.write(json.dumps(rec, default=repr) + "\n")  # state keys may hold sets
        self.samples.flush()
        text = "\n\n---\n\n".join(
            f"reward={t.reward:.2f} stop={t.stop_reason}\n\n    " + tok.decode(t.ids).replace("\n", "\n    ")
            for t in trajs[: min(n, 2)]
        )
        self.tb.add_text(f"{tag}/samples", text, step)

    def progress(self, values: dict[str, Any]) -> None:
        if self.bar is not None:  # the values first: update() draws the bar, with the step's own values
            self.bar.set_postfix({k: f"{v:.3g}" for k, v in values.items()}, refresh=False)
            self.bar.update(1)

    def resumed_at(self, step: int) -> None:
        """A resumed run's bar starts at the step it resumed from, so the count and the ETA are for what is left."""
        if self.bar is not None:
            self.bar.n = self.bar.last_print_n = step
            self.bar.refresh()

    def print(self, msg: str) -> None:
        if not self.enabled:
            return
        if self.bar is not None:
            self.bar.write(msg)
        else:
            print(msg, flush=True)

    def write_json(self, name: str, obj: Any) -> None:
        if self.enabled:
            with open(os.path.join(self.run_dir, name), "w") as f:
                json.dump(obj, f, indent=2, default=str)

    def outputs(self, model: str | None, loaded: str) -> str:
        """The closing lines that say where the run's outputs are: `model` is the final export, None where no step
        ran (the model is still `loaded`)."""
        d = self.run_dir
        exported = (
            f"{model}  (HF format: --model.path, evals' --ckpt)" if model else f"unchanged, no step ran: {loaded}"
        )
        return (
            f"\n  summary      {os.path.join(d, 'summary.json')}"
            + f"\n  model        {exported}"
            + f"\n  TensorBoard  {command('tensorboard')} --logdir {d}"
            + f"\n  episodes     {command('python')} -m nanosky.view {d}   (one HTML page: groups, turns, tokens)"
        )

    def close(self) -> None:
        if not self.enabled:
            return
        if self.bar is not None:
            self.bar.close()
            self.bar = None
        if self.samples is not None:
            self.samples.close()
            self.tb.close()
            self.samples = None
