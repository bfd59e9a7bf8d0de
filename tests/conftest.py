"""Shared fixtures: the bundled tiny model and a 1-rank process group (vLLM's external_launcher needs one)."""

import os

import pytest

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


@pytest.fixture(scope="session")
def tiny_path() -> str:
    from nanosky.tiny import ensure_tiny_model

    return str(ensure_tiny_model())


@pytest.fixture(scope="session")
def tok(tiny_path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_path)


@pytest.fixture(scope="session")
def dist_info():
    from nanosky import dist

    return dist.init_distributed()


@pytest.fixture(scope="session")
def engine(tiny_path, dist_info):
    from nanosky.rollout.engine import Engine, EngineConfig

    return Engine(EngineConfig(kv_cache_gib=1, seed=0), tiny_path, dist_info)
