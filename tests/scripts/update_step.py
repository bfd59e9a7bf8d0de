"""One PolicyUpdate step on a fixed synthetic batch; rank 0 saves the gradient. Used by tests/test_update.py to
check that the gradient does not depend on micro-batch size or world size.

    torchrun --nproc_per_node 2 tests/scripts/update_step.py OUT.pt MICRO_BS MODE POLICY_LOSS [ref_kl] [adv=NAME]
        [pack=prefix|flat|none] [tokens=N] [equal=K] [idle=1] [skip=0|1] [old=1] [attn=grouped] [chunk=N]
        [";" OUT.pt MICRO_BS ...]

Several steps separated by ";" run one after the other in one launch, each from a freshly loaded model (starting
the processes costs more than a step).

The groups share their prompt, as GRPO groups do. With `adv=NAME`, advantages come from that estimator (default
grpo); `pack` and `tokens` set `optim.packing` and `optim.micro_batch_tokens`; `equal=K` gives the first K groups equal rewards (zero advantages), `idle=1` every group of rank 0, `skip` sets
`optim.skip_zero_adv`; `attn=grouped` trains with prefix-grouped attention, `chunk` sets the LM head's chunk
(`optim.head_chunk_tokens`); `old=1` runs 2 mini-batches from old logprobs computed beforehand, only for the rows the
update passes on when it skips (the metrics then hold `old_max_diff`, their largest gap to every row's). With `ref_kl`, the batch carries reference logprobs and `track_ref_kl` is on (kl_coef stays 0): the update must
be unchanged and train/kl logged. The metrics go to OUT.json.
"""

import json
import random
import sys

import torch
from torch.distributed.tensor import DTensor

import algos
from nanosky import dist
from nanosky.agent.trajectory import Trajectory
from nanosky.precision import decide
from nanosky.tiny import ensure_tiny_model
from nanosky.train import grouped_attention
from nanosky.train.batch import compute_advantages, split_groups, to_batch, token_rewards
from nanosky.train.policy import load_model
from nanosky.train.update import OptimConfig, PolicyUpdate, forward_logprobs, signal_rows


class GradRecorder(torch.optim.Optimizer):
    def __init__(self, model):
        self.named = list(model.named_parameters())
        super().__init__([p for _, p in self.named], {"lr": 1.0})
        self.total: dict[str, torch.Tensor] = {}

    @torch.no_grad()
    def step(self, closure=None):
        for name, p in self.named:  # full_tensor is a collective: every rank walks the same list
            g = p.grad.full_tensor() if isinstance(p.grad, DTensor) else p.grad
            self.total[name] = self.total.get(name, 0) + g.clone()


def main(
    out: str,
    micro_bs: int,
    mode: str,
    loss: str,
    ref_kl: bool = False,
    adv: str = "grpo",
    pack: str = "prefix",
    tokens: int = 0,
    equal: int = 0,
    skip: bool = True,
    idle: bool = False,
    old: bool = False,
    attn: str = "mask",
    chunk: int = 1024,
) -> None:
    info = dist.init_distributed()
    path = str(ensure_tiny_model())
    model = load_model(path, info, precision=decide("fp32", info.device.type))
    if attn == "grouped":
        assert grouped_attention.enable(model)
    rng = random.Random(0)
    trajs = []
    prompts = [[rng.randint(3, 500) for _ in range(rng.randint(5, 12))] for _ in range(4)]
    for i in range(16):  # 4 groups of 4 sharing their prompt, varied lengths
        p, r = len(prompts[i // 4]), rng.randint(1, 9)
        ids = prompts[i // 4] + [rng.randint(3, 500) for _ in range(r)]
        trajs.append(
            Trajectory(
                ids=ids,
                loss_mask=[0] * p + [1] * r,
                logprobs=[0.0] * p + [-1.0] * r,
                prompt_len=p,
                reward=1.0 if i // 4 < equal else float(rng.random() < 0.5),
                group=i // 4,
            )
        )
    cfg = algos.preset(
        "grpo",
        adv_estimator=adv,
        loss_agg_mode=mode,
        policy_loss=loss,
        track_ref_kl=ref_kl,
        norm_const=16,
        mini_batches=2 if old else 1,
    )
    parts = split_groups(trajs, info.world)
    if idle:  # rank 0's groups all get equal rewards: with skipping, that rank trains nothing
        for i in parts[0]:
            trajs[i].reward = 1.0
    local = parts[info.rank]
    batch = to_batch([trajs[i] for i in local], 0, info.device)
    compute_advantages(batch, cfg, token_rewards(batch))
    if ref_kl:  # a reference that differs from the policy by a fixed offset per token
        batch.ref_logprobs = torch.full_like(batch.rollout_logprobs, -2.0)
    optim = OptimConfig(
        lr=1.0,
        grad_clip=0.0,
        micro_batch_size=micro_bs,
        micro_batch_tokens=tokens,
        packing=pack,
        skip_zero_adv=skip,
        head_chunk_tokens=chunk,
    )
    update = PolicyUpdate(optim, cfg, model)
    # an optimizer that records the gradient (the sum over optimizer steps) instead of stepping: parameter deltas
    # would lose the gradient's low bits next to weights of magnitude 1 (the layer norms). Made before any forward:
    # after a no-grad one FSDP leaves the unsharded parameters in the modules until the next backward
    update.opt = GradRecorder(model)
    update.sched = torch.optim.lr_scheduler.LambdaLR(update.opt, lambda s: 1.0)
    extra = {}
    if old:  # as trainer.prepare does: only the rows the update passes on, when it skips
        batch.old_logprobs = forward_logprobs(model, batch, optim, signal_only=update.skip)
        full = forward_logprobs(model, batch, optim)
        rows = signal_rows(batch) if update.skip else list(range(len(batch)))
        others = [i for i in range(len(batch)) if i not in rows]
        diff = (batch.old_logprobs[rows] - full[rows]).abs().max().item() if rows else 0.0
        assert not others or batch.old_logprobs[others].abs().max().item() == 0.0  # not computed
        extra["old_max_diff"] = diff  # rank 0's
    metrics = update(batch) | extra
    delta = update.opt.total
    if info.is_main:
        torch.save(delta, out)
        with open(out + ".json", "w") as f:
            json.dump(metrics, f)
    dist.barrier()


def run(argv: list[str]) -> None:
    kw = dict(a.split("=", 1) for a in argv[4:] if "=" in a)
    main(
        argv[0],
        int(argv[1]),
        argv[2],
        argv[3],
        "ref_kl" in argv[4:],
        kw.get("adv", "grpo"),
        kw.get("pack", "prefix"),
        int(kw.get("tokens", 0)),
        int(kw.get("equal", 0)),
        kw.get("skip", "1") == "1",
        kw.get("idle", "0") == "1",
        kw.get("old", "0") == "1",
        kw.get("attn", "mask"),
        int(kw.get("chunk", 1024)),
    )


if __name__ == "__main__":
    torch.use_deterministic_algorithms(True)
    spec: list[str] = []
    for a in [*sys.argv[1:], ";"]:
        if a == ";":
            run(spec)
            spec = []
        else:
            spec.append(a)
    dist.shutdown()
