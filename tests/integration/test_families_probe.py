"""The build sync's probe crosses the model's sliding window: an engine whose window is one position off the
trainer's is refused by name before step 1, even where the window is longer than the probe every later sync scores.
Cohere2 with a 120-token window; without nanosky's fix for vLLM's Command-R window (`ENGINE_WINDOW_OFFSET`), the
trainer's window is 120 and the engine's 121. (Named to run after every test of the shared `engine` fixture: this
module's engine teardown ends the process's vLLM parallel state.)"""

import gc

import pytest
from cpu import FP32
from families import build

from nanosky.cli import parse_args
from nanosky.rollout.chat import load_tokenizer
from nanosky.rollout.engine import Engine, EngineConfig
from nanosky.sync import BuildRefused, Probe, build_probe, sync_weights
from nanosky.train import policy as policy_mod
from nanosky.train.policy import load_model

WINDOW = 120


@pytest.fixture(scope="module")
def cohere2(tmp_path_factory, dist_info):
    path = build("cohere2", str(tmp_path_factory.mktemp("c2")), sliding_window=WINDOW)
    cfg = parse_args(["--preset", "smoke", "--model.path", path, "--engine.max-model-len", "256"], console=False)
    engine = Engine(
        EngineConfig(kv_cache_gib=0.25, max_model_len=256, max_batched_tokens=256, seed=0),
        path,
        dist_info,
        precision=FP32,
    )
    yield path, cfg, load_tokenizer(path), engine
    del engine
    gc.collect()


def test_the_build_probe_crosses_the_window(cohere2, dist_info):
    path, cfg, tok, _ = cohere2
    probe = build_probe(cfg, tok, load_model(path, dist_info, precision=FP32).config)
    assert len(probe.ids) < WINDOW < len(probe.build_ids) <= 256  # every later sync: the short one
    assert probe.current == probe.build_ids


def test_an_engine_window_one_off_is_refused_at_build_by_name(cohere2, dist_info, monkeypatch):
    path, cfg, tok, engine = cohere2
    monkeypatch.setattr(policy_mod, "ENGINE_WINDOW_OFFSET", {})  # the trainer's window 120, the engine's 121
    off = load_model(path, dist_info, precision=FP32)
    short = Probe(build_probe(cfg, tok, off.config).ids)
    sync_weights(off, engine, 1, short)  # the short probe never reaches the window: it would pass
    with pytest.raises(BuildRefused, match=r"Cohere2ForCausalLM: the trainer and the engine disagree from position"):
        sync_weights(off, engine, 1, build_probe(cfg, tok, off.config))
    monkeypatch.undo()

    fixed = load_model(path, dist_info, precision=FP32)  # the window aligned with the engine's: exact across the edge
    probe = build_probe(cfg, tok, fixed.config)
    m = sync_weights(fixed, engine, 2, probe)
    assert m["rollout/logprob_diff_max"] < 1e-4 and probe.built and probe.current == probe.ids
