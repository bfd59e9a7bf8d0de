"""Peak memory of one training micro-batch on a 152k vocabulary: the plain LM head ([tokens, vocab] fp32 logits, a
log-softmax and its exp, kept for backward) vs the chunked head (`nanosky/train/head.py`), back to back.

    python bench/head_memory.py [--rows 8] [--tokens 320] [--prompt 64] [--chunk 1024]

A random Qwen2 of the Qwen2.5 vocabulary (151,936; hidden 256, 2 layers): `rows` sequences of `tokens` tokens sharing
a `prompt`-token prefix, packed with prefix sharing as training packs them, the completion as the loss mask; log p,
the entropy bonus and backward, as the GRPO update runs them. Each head runs in a fresh process; the figure is its
RSS growth from just before the forward to the peak (CPU: ru_maxrss). Prints both, the step times, and as its last
line `ratio=<plain peak / chunked peak>`.
"""

import argparse
import json
import os
import resource
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)


def _rss_mib() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize() / 2**20


def worker(chunk: int, rows: int, tokens: int, prompt: int) -> dict:
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from nanosky.train import head, packing

    torch.manual_seed(0)
    cfg = Qwen2Config(
        vocab_size=151936,
        hidden_size=256,
        intermediate_size=512,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=4096,
        tie_word_embeddings=True,
    )
    model = Qwen2ForCausalLM(cfg)
    head.install(model)
    g = torch.Generator().manual_seed(1)
    shared = torch.randint(3, cfg.vocab_size, (prompt,), generator=g).tolist()
    seqs = [shared + torch.randint(3, cfg.vocab_size, (tokens - prompt,), generator=g).tolist() for _ in range(rows)]
    T = tokens - 1
    keep = torch.zeros(rows, T, dtype=torch.bool)
    keep[:, prompt - 1 :] = True  # the completion
    p = packing.pack(seqs, T)
    adv = torch.randn(rows, T, generator=g)
    model.zero_grad()
    before = _rss_mib()
    t0 = time.perf_counter()
    lp, ent = packing.logprobs(model, p, True, True, keep=keep, chunk=chunk)
    ((lp * adv + 0.01 * ent) * keep).sum().backward()
    secs = time.perf_counter() - t0
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return {"peak_mib": peak - before, "s": secs, "scored": int(keep.sum())}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=8)
    ap.add_argument("--tokens", type=int, default=320)
    ap.add_argument("--prompt", type=int, default=64)
    ap.add_argument("--chunk", type=int, default=1024)
    args = ap.parse_args()
    res = {}
    for name, chunk in (("plain", 0), ("chunked", args.chunk)):
        cmd = [
            sys.executable,
            __file__,
            "--worker",
            str(chunk),
            str(args.rows),
            str(args.tokens),
            str(args.prompt),
        ]
        out = subprocess.run(cmd, capture_output=True, text=True, env=dict(os.environ, OMP_NUM_THREADS="2"))
        if out.returncode != 0:
            raise SystemExit(out.stderr[-3000:])
        res[name] = json.loads(out.stdout.strip().splitlines()[-1])
    n = res["plain"]["scored"]
    print(f"vocab 151936, {args.rows} rows x {args.tokens} tokens ({args.prompt} shared), {n} scored positions")
    full = n * 151936 * 4 / 2**20
    print(f"one [scored, vocab] fp32 tensor: {full:.0f} MiB")
    for name in ("plain", "chunked"):
        r = res[name]
        print(f"{name:>8}: peak +{r['peak_mib']:.0f} MiB | forward+backward {r['s']:.2f} s")
    print(f"ratio={res['plain']['peak_mib'] / res['chunked']['peak_mib']:.2f}")


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        print(json.dumps(worker(*(int(x) for x in sys.argv[2:6]))))
    else:
        main()
