"""Training checkpoints with exact resume: sharded model/optimizer state, schedule, RNG states and run state.

Layout under a checkpoint root (e.g. runs/x/checkpoints):

    step_000010/
        dcp/            model + optimizer (+ extra models/optimizers) as sharded DCP state, resharded on load
        train_state.pt  the caller's `state` (step, data position, config, ...) and the LR scheduler state
        rank_{r}.pt     rank r's RNG states: python `random`, numpy, torch CPU (+ CUDA)
        export/         optional: whatever the caller's `export` hook wrote (an HF model, a peft adapter)
        COMPLETE        written last, before the directory gets its final name
    latest              one line: the name of the newest complete checkpoint directory

A save is atomic: everything goes into `.tmp-step_000010-<nonce>/`, is fsync'ed, gets the COMPLETE marker, and the
directory is renamed into place; `latest` is replaced (write + fsync + os.replace) only after that. A crash or
`kill -9` at any point leaves `latest` pointing at the previous complete checkpoint. Frozen parameters (a LoRA base)
are not saved: they come back from the model path on resume.

Multi-node runs need `root` on a filesystem every node sees (DCP writes each rank's shards into the same directory).
"""

from __future__ import annotations

import json
import os
import random
import re
import shutil
import time
import uuid
from collections.abc import Callable

import numpy as np
import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_state_dict,
    set_model_state_dict,
    set_state_dict,
)

from nanosky.exports import LATEST, read_latest

COMPLETE = "COMPLETE"
_STEP_RE = re.compile(r"^step_(\d+)$")
# Frozen parameters are reloaded from the model path, so a LoRA checkpoint holds only the adapter. Loading is
# non-strict only because those frozen keys are absent; every key that was saved must load (dcp.load checks it).
_SAVE_OPTS = StateDictOptions(ignore_frozen_params=True)
_LOAD_OPTS = StateDictOptions(ignore_frozen_params=True, strict=False)


def step_dir_name(step: int) -> str:
    return f"step_{step:06d}"


# ---- small filesystem helpers -----------------------------------------------------------------------------------
def _fsync_dir(path: str) -> None:
    """Make a directory's entries (new files, renames) durable, not only the files' contents."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_tree(path: str) -> None:
    for dirpath, _, files in os.walk(path):
        for f in files:
            with open(os.path.join(dirpath, f), "rb") as fh:
                os.fsync(fh.fileno())
        _fsync_dir(dirpath)


def _torch_save_synced(obj, path: str) -> None:
    with open(path, "wb") as f:
        torch.save(obj, f)
        f.flush()
        os.fsync(f.fileno())


def _write_text_synced(path: str, text: str) -> None:
    with open(path, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())


def _broadcast(obj):
    box = [obj]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def is_complete(path: str) -> bool:
    return os.path.isfile(os.path.join(path, COMPLETE))


def list_checkpoints(root: str) -> list[tuple[int, str]]:
    """(step, path) of every complete checkpoint under `root`, oldest first."""
    if not os.path.isdir(root):
        return []
    out = []
    for name in os.listdir(root):
        m = _STEP_RE.match(name)
        if m and is_complete(os.path.join(root, name)):
            out.append((int(m.group(1)), os.path.join(root, name)))
    return sorted(out)


# ---- RNG ----------------------------------------------------------------------------------------------------------
def rng_state() -> dict:
    s = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        s["cuda"] = torch.cuda.get_rng_state()  # the current device: one device per rank
    return s


def set_rng_state(s: dict) -> None:
    random.setstate(s["python"])
    np.random.set_state(s["numpy"])
    torch.set_rng_state(s["torch"])
    if "cuda" in s and torch.cuda.is_available():
        torch.cuda.set_rng_state(s["cuda"])


# ---- model + optimizer state -------------------------------------------------------------------------------------
def _pairs(model, optimizer, extra_models: dict | None, extra_optimizers: dict | None) -> dict[str, tuple]:
    """Name → (model, optimizer or None): the policy is "policy", extras keep their names (e.g. "critic")."""
    extra_models, extra_optimizers = extra_models or {}, extra_optimizers or {}
    unknown = set(extra_optimizers) - set(extra_models)
    if unknown:
        raise ValueError(f"extra_optimizers {sorted(unknown)} have no model in extra_models")
    if "policy" in extra_models:
        raise ValueError('extra_models may not use the reserved name "policy"')
    pairs = {"policy": (model, optimizer)}
    for name, m in extra_models.items():
        pairs[name] = (m, extra_optimizers.get(name))
    return pairs


def _sharded_state(pairs: dict[str, tuple]) -> dict:
    """{"policy/model": ..., "policy/optim": ...}: DTensor shards that DCP writes (or loads into) in place."""
    sd = {}
    for name, (m, opt) in pairs.items():
        if opt is None:
            sd[f"{name}/model"] = get_model_state_dict(m, options=_SAVE_OPTS)
        else:
            sd[f"{name}/model"], sd[f"{name}/optim"] = get_state_dict(m, opt, options=_SAVE_OPTS)
        # ignore_frozen_params misses tied aliases of frozen parameters (lm_head.weight = embed_tokens.weight).
        for n, p in m.named_parameters(remove_duplicate=False):
            if not p.requires_grad:
                sd[f"{name}/model"].pop(n, None)
    return sd


# ---- save ---------------------------------------------------------------------------------------------------------
def save_checkpoint(
    root: str,
    step: int,
    *,
    model,
    optimizer,
    scheduler=None,
    extra_models: dict | None = None,
    extra_optimizers: dict | None = None,
    state: dict,
    keep: int = 3,
    export: Callable[[str], None] | None = None,
    _on_stage: Callable[[str], None] | None = None,
) -> str:
    """Write root/step_{step:06d} atomically; return its path. Collective: every rank calls it.

    `state`: anything picklable (step, data position, config dict, ...); `load_checkpoint` returns it.
    `keep`: prune to the newest `keep` complete checkpoints (0 = keep all).
    `export(dir)`: optional collective hook that writes extra files (e.g. `save_merged(model, tok, dir)`) into the
    checkpoint before it is committed, so an HF export is exactly as atomic as the training state.
    `_on_stage(stage)`: testing only; called on every rank at "written" (all files on disk, not committed) and at
    "renamed" (directory in place, `latest` not yet updated), so a test can kill the process at those points.
    """
    if keep < 0:
        raise ValueError(f"keep must be >= 0, got {keep}")
    rank, world = dist.get_rank(), dist.get_world_size()
    final = os.path.join(root, step_dir_name(step))
    # One temporary name for all ranks: DCP writes every rank's shards into the same directory.
    tmp = _broadcast(os.path.join(root, f".tmp-{step_dir_name(step)}-{uuid.uuid4().hex[:8]}") if rank == 0 else None)
    if rank == 0:
        os.makedirs(tmp)
    dist.barrier()

    pairs = _pairs(model, optimizer, extra_models, extra_optimizers)
    dcp.save(_sharded_state(pairs), checkpoint_id=os.path.join(tmp, "dcp"))  # fsyncs its own files
    _torch_save_synced(rng_state(), os.path.join(tmp, f"rank_{rank}.pt"))
    if rank == 0:
        sched = scheduler.state_dict() if scheduler is not None else None
        _torch_save_synced(
            {"state": state, "scheduler": sched, "world_size": world}, os.path.join(tmp, "train_state.pt")
        )
    if export is not None:
        export(os.path.join(tmp, "export"))
    dist.barrier()  # every rank's files are written before rank 0 commits
    if _on_stage:
        _on_stage("written")

    if rank == 0:
        _fsync_tree(tmp)
        meta = {"step": step, "world_size": world, "time": time.time(), "groups": sorted(pairs)}
        _write_text_synced(os.path.join(tmp, COMPLETE), json.dumps(meta) + "\n")
        _fsync_dir(tmp)
        _commit(root, tmp, final)
    if _on_stage:
        _on_stage("renamed")
    if rank == 0:
        _point_latest(root, os.path.basename(final))
        _prune(root, keep)
    dist.barrier()
    return final


def _commit(root: str, tmp: str, final: str) -> None:
    trash = None
    # Re-saving a step (e.g. after resuming from an older PATH): move the old one aside. If `latest` names it and we
    # crash right here, resolve_checkpoint fails loudly instead of loading something else.
    if os.path.exists(final):
        trash = os.path.join(root, f".trash-{os.path.basename(final)}-{uuid.uuid4().hex[:8]}")
        os.rename(final, trash)
    os.rename(tmp, final)
    _fsync_dir(root)
    if trash:
        shutil.rmtree(trash, ignore_errors=True)


def _point_latest(root: str, name: str) -> None:
    tmp = os.path.join(root, LATEST + ".tmp")
    _write_text_synced(tmp, name + "\n")
    os.replace(tmp, os.path.join(root, LATEST))
    _fsync_dir(root)


def _prune(root: str, keep: int) -> None:
    """Drop all but the newest `keep` complete checkpoints and leftovers of crashed saves. Renamed out of the
    step_* namespace before deletion, so a crash mid-delete never leaves a half-deleted "complete" checkpoint."""
    latest = read_latest(root)
    doomed = [p for _, p in list_checkpoints(root)[:-keep]] if keep else []
    doomed = [p for p in doomed if os.path.basename(p) != latest]
    doomed += [os.path.join(root, n) for n in os.listdir(root) if n.startswith((".tmp-", ".trash-"))]
    for p in doomed:
        trash = p
        if not os.path.basename(p).startswith("."):
            trash = os.path.join(root, f".trash-{os.path.basename(p)}-{uuid.uuid4().hex[:8]}")
            os.rename(p, trash)
        shutil.rmtree(trash, ignore_errors=True)
    _fsync_dir(root)


# ---- resolve + load ---------------------------------------------------------------------------------------------
def resolve_checkpoint(root: str, resume: str) -> str:
    """The checkpoint directory `--resume` names: "latest" (what root/latest points to) or a PATH. Raises
    FileNotFoundError rather than ever returning nothing: a requested resume never silently starts from scratch."""
    if resume == "latest":
        name = read_latest(root)
        if name is None:
            raise FileNotFoundError(f"--resume latest requested but no complete checkpoint under {root}")
        path = os.path.join(root, name)
        if not is_complete(path):
            raise FileNotFoundError(
                f"--resume latest: {root}/{LATEST} points to {name}, which is missing or "
                f"incomplete (no {COMPLETE} marker)"
            )
        return path
    if not os.path.isdir(resume):
        raise FileNotFoundError(f"--resume {resume}: no such checkpoint directory")
    if not is_complete(resume):
        if os.path.isfile(os.path.join(resume, LATEST)):
            raise FileNotFoundError(
                f"--resume {resume}: that is a checkpoint root; pass --resume latest with it as "
                f"the root, or one of its step_* directories"
            )
        raise FileNotFoundError(f"--resume {resume}: not a complete checkpoint (no {COMPLETE} marker)")
    return resume


def read_state(path: str) -> dict:
    """The `state` saved with a checkpoint (e.g. to check its config) without touching any model."""
    return torch.load(os.path.join(path, "train_state.pt"), weights_only=False)["state"]


def load_checkpoint(
    path: str,
    *,
    model,
    optimizer,
    scheduler=None,
    extra_models: dict | None = None,
    extra_optimizers: dict | None = None,
) -> dict:
    """Restore model/optimizer (resharded to the current world), scheduler and this rank's RNG states from a
    checkpoint written by `save_checkpoint` with the same model/optimizer groups. Collective. Returns `state`."""
    if not is_complete(path):
        raise FileNotFoundError(f"{path} is not a complete checkpoint (no {COMPLETE} marker)")
    rank, world = dist.get_rank(), dist.get_world_size()
    meta = torch.load(os.path.join(path, "train_state.pt"), weights_only=False)
    rng_file = os.path.join(path, f"rank_{rank}.pt")
    if meta["world_size"] != world or not os.path.isfile(rng_file):
        # The sharded state would reshard fine, but per-rank RNG streams cannot be mapped onto another world size.
        raise ValueError(
            f"checkpoint {path} was saved with world size {meta['world_size']}, this run has {world}: "
            f"per-rank RNG states cannot be restored exactly"
        )

    pairs = _pairs(model, optimizer, extra_models, extra_optimizers)
    sd = _sharded_state(pairs)
    dcp.load(sd, checkpoint_id=os.path.join(path, "dcp"))
    for name, (m, opt) in pairs.items():
        if opt is None:
            set_model_state_dict(m, sd[f"{name}/model"], options=_LOAD_OPTS)
        else:
            set_state_dict(
                m,
                opt,
                model_state_dict=sd[f"{name}/model"],
                optim_state_dict=sd[f"{name}/optim"],
                options=_LOAD_OPTS,
            )
    if scheduler is not None:
        if meta["scheduler"] is None:
            raise ValueError(f"checkpoint {path} has no scheduler state but a scheduler was passed")
        scheduler.load_state_dict(meta["scheduler"])
    set_rng_state(torch.load(rng_file, weights_only=False))
    dist.barrier()
    return meta["state"]


# ---- compatibility --------------------------------------------------------------------------------------------
_MISSING = "<missing>"


def _lookup(d: dict, dotted: str):
    cur = d
    for part in dotted.split("."):
        if not isinstance(cur, dict) or part not in cur:
            return _MISSING
        cur = cur[part]
    return cur


def check_compatible(saved_config: dict, config: dict, fields: list[str]) -> None:
    """Refuse a resume whose config differs in a field that breaks it ("model.path", "world_size", ...)."""
    for f in fields:
        a, b = _lookup(saved_config, f), _lookup(config, f)
        # JSON round trips turn tuples into lists: compare them as equal.
        if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
            a, b = list(a), list(b)
        if a != b:
            raise ValueError(f"resume refused: {f} differs (saved {a!r}, now {b!r})")
