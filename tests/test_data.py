"""Shard format, loader determinism and DDP sharding, corpus sources, and the data errors."""

import json
import os

import numpy as np
import pytest

import data as data_lib
from data.embedded import documents as embedded_documents
from data.shards import HEADER_BYTES, ShardError, TokenWindows, TrainBatches, read_header, read_shard, write_shard
from data.tokenizer import Tokenizer, load_pretrained


@pytest.mark.parametrize("vocab,dtype", [(1000, np.uint16), (70000, np.uint32)])
def test_shard_round_trip(tmp_path, vocab, dtype):
    toks = np.random.default_rng(0).integers(0, vocab, 5000)
    write_shard(tmp_path / "a.bin", toks, vocab)
    h = read_header(tmp_path / "a.bin")
    assert h == {"n_tokens": 5000, "vocab_size": vocab, "dtype": dtype}
    assert np.array_equal(read_shard(tmp_path / "a.bin"), toks)
    assert os.path.getsize(tmp_path / "a.bin") == HEADER_BYTES + 5000 * np.dtype(dtype).itemsize
    assert not list(tmp_path.glob("*.tmp"))


def test_bad_shards_are_named(tmp_path):
    write_shard(tmp_path / "a.bin", np.arange(100), 128)
    raw = (tmp_path / "a.bin").read_bytes()
    (tmp_path / "trunc.bin").write_bytes(raw[:-10])
    with pytest.raises(ShardError, match="trunc.bin is truncated"):
        read_header(tmp_path / "trunc.bin")
    (tmp_path / "junk.bin").write_bytes(b"x" * 200)
    with pytest.raises(ShardError, match="not a token shard"):
        read_header(tmp_path / "junk.bin")
    with pytest.raises(ShardError, match="does not exist"):
        read_header(tmp_path / "missing.bin")
    with pytest.raises(ShardError, match="vocabulary of 128 tokens, the model has 256"):
        TokenWindows([tmp_path / "a.bin"], 8, vocab_size=256)
    with pytest.raises(ShardError, match="do not fill one window"):
        TokenWindows([tmp_path / "a.bin"], 100)
    with pytest.raises(ShardError, match="token ids must lie"):
        write_shard(tmp_path / "b.bin", np.array([5, 300]), 256)


def test_windows_are_input_and_shifted_target(tmp_path):
    write_shard(tmp_path / "a.bin", np.arange(101), 128)
    w = TokenWindows([tmp_path / "a.bin"], 10, shuffle=False)
    assert len(w) == 10
    x, y = w.batch([3])
    assert x.tolist() == [list(range(30, 40))] and y.tolist() == [list(range(31, 41))]


def test_loader_is_deterministic_and_world_size_independent(tmp_path):
    for i in range(3):
        write_shard(tmp_path / f"s{i}.bin", np.random.default_rng(i).integers(0, 500, 997), 500)
    paths = sorted(tmp_path.glob("*.bin"))
    single = TrainBatches(TokenWindows(paths, 16, seed=3), micro_batch=4, accum=4)
    again = TrainBatches(TokenWindows(paths, 16, seed=3), micro_batch=4, accum=4)
    assert all((single.get(s, m)[0] == again.get(s, m)[0]).all() for s in range(5) for m in range(4))
    # 2 ranks x accum 2 read exactly the same global batch as 1 rank x accum 4
    for step in (0, 7, 40):  # 40 is past the first epoch (186 windows / 16 per step)
        one = sorted(map(tuple, np.concatenate([single.get(step, m)[0].numpy() for m in range(4)])))
        two = [TrainBatches(TokenWindows(paths, 16, seed=3), 4, 2, rank=r, world=2) for r in range(2)]
        both = sorted(map(tuple, np.concatenate([t.get(step, m)[0].numpy() for t in two for m in range(2)])))
        assert one == both
    other_seed = TrainBatches(TokenWindows(paths, 16, seed=4), micro_batch=4, accum=4)
    assert not (other_seed.get(0, 0)[0] == single.get(0, 0)[0]).all()


def test_epochs_cover_every_window_once(tmp_path):
    write_shard(tmp_path / "a.bin", np.arange(161), 200)
    w = TokenWindows([tmp_path / "a.bin"], 10, seed=1)
    starts = [w.window(g)[0] for g in range(16)]
    assert sorted(starts) == list(range(0, 160, 10))
    assert [w.window(g)[0] for g in range(16, 32)] != starts  # reshuffled next epoch


def test_embedded_corpus_is_real_deterministic_prose():
    docs = embedded_documents()
    assert docs == embedded_documents()
    size = sum(len(d) for d in docs)
    assert size > 1_000_000, size
    assert any('The "for" statement' in d for d in docs[:100])  # pydoc topics come first


def test_prepare_embedded_caches_and_splits(data_cache):
    cfg = {"name": "embedded", "tokenizer": "bpe", "vocab_size": 512, "cache_dir": data_cache}
    info = data_lib.prepare(cfg, progress=False)
    assert info.n_train_tokens > 10 * info.n_val_tokens > 0
    assert info.tokenizer.vocab_size == 512
    total = sum(read_header(p)["n_tokens"] for p in info.train_shards)
    assert total == info.n_train_tokens
    eot = read_shard(info.train_shards[0]) == info.tokenizer.eot_id
    assert eot.sum() > 100  # documents are separated
    meta = json.loads((data_lib.Path(info.dir) / "meta.json").read_text())
    assert meta["n_val_tokens"] == info.n_val_tokens
    again = data_lib.prepare(cfg, progress=False)  # cached: same files, no rework
    assert again.train_shards == info.train_shards


def test_text_and_jsonl_sources(tmp_path):
    txt = tmp_path / "docs"
    txt.mkdir()
    for i in range(40):
        (txt / f"{i:02d}.txt").write_text(f"Document number {i}. " + "The quick brown fox jumps. " * 20)
    info = data_lib.prepare({"name": "text", "files": str(txt / "*.txt"), "tokenizer": "byte",
                             "cache_dir": str(tmp_path / "c")}, progress=False)
    assert info.n_train_tokens + info.n_val_tokens == sum(len(p.read_bytes()) + 1 for p in txt.glob("*.txt"))
    js = tmp_path / "d.jsonl"
    js.write_text("".join(json.dumps({"body": f"row {i} " * 5}) + "\n" for i in range(40)))
    info = data_lib.prepare({"name": "text", "files": str(js), "format": "json", "text_field": "body",
                             "tokenizer": "byte", "cache_dir": str(tmp_path / "c")}, progress=False)
    assert info.tokenizer.decode(read_shard(info.val_shards[0])[:6]) == "row 19"
    with pytest.raises(ValueError, match="not a field"):
        data_lib.prepare({"name": "text", "files": str(js), "format": "json", "text_field": "nope",
                          "cache_dir": str(tmp_path / "c")}, progress=False)
    with pytest.raises(FileNotFoundError, match="nothing matches"):
        data_lib.prepare({"name": "text", "files": str(tmp_path / "none*.txt"), "cache_dir": str(tmp_path)})


def test_hub_tokenizer_offline_fails_clearly(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(RuntimeError, match="could not load tokenizer 'gpt2'.*Offline"):
        load_pretrained("gpt2")


def test_byte_tokenizer_round_trip():
    tok = Tokenizer("byte")
    s = "héllo, wörld"
    assert tok.decode(tok.encode(s)) == s and tok.vocab_size == 257
