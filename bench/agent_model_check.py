"""An agent model's T = 1 success and admissible-action rate on held-out webshop_lite / alfworld_lite episodes, as
`--rollout.mode stepwise --rollout.history-window 2 --env-kwargs show_actions true` prompts it (HF generate, no
engine: a quick check of a fresh `python -m nanosky.tiny` build).

    python bench/agent_model_check.py MODEL_DIR [N_EPISODES]
"""

import sys

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

import envs
from envs.base import extract_action
from nanosky.agent.window import window
from nanosky.rollout.chat import prompt_ids

path = sys.argv[1]
n = int(sys.argv[2]) if len(sys.argv) > 2 else 10
tok = AutoTokenizer.from_pretrained(path)
m = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
torch.manual_seed(0)
for name, kw in [("alfworld_lite", {}), ("webshop_lite", {"page_size": 3})]:
    succ, valid, total = 0, 0, 0
    for seed in range(n):
        env = envs.make(name, split="test", seed=seed, show_actions=True, **kw)
        msgs = env.reset()
        for _ in range(env.max_turns):
            ids = prompt_ids(tok, window(msgs, 2))
            out = m.generate(torch.tensor([ids]), max_new_tokens=32, do_sample=True, temperature=1.0, top_p=1.0)
            a = tok.decode(out[0, len(ids) :], skip_special_tokens=True).strip()
            total += 1
            valid += extract_action(a).strip().lower() in [x.lower() for x in env.available_actions()]
            res = env.step(a)
            msgs += [{"role": "assistant", "content": a}, *res.observations]
            if res.done:
                break
        succ += bool(res.info.get("success"))
    print(name, "success", succ / n, "admissible", round(valid / total, 3), "turns", total / n, flush=True)
