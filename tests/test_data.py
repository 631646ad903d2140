"""Shard format, loader determinism and DDP sharding, corpus sources, and the data errors."""

import json
import math
import os

import numpy as np
import pytest

from duality import data as data_lib
from duality.data.embedded import documents as embedded_documents
from duality.data.shards import (
    HEADER_BYTES,
    ShardError,
    TokenWindows,
    TrainBatches,
    rank_batches,
    read_header,
    read_shard,
    write_shard,
)
from duality.data.tokenizer import Tokenizer, load_pretrained


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


@pytest.mark.slow
def test_embedded_corpus_is_real_deterministic_prose():
    docs = embedded_documents()
    assert docs == embedded_documents()
    size = sum(len(d) for d in docs)
    assert size > 1_000_000, size
    assert any('The "for" statement' in d for d in docs[:100])  # pydoc topics come first


@pytest.mark.slow
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


@pytest.mark.slow
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


def test_jsonl_is_known_by_its_extension_and_one_file_gets_an_error_that_says_what_to_do(tmp_path):
    """data=text without data.format: a .jsonl file is read as JSON lines (its "text" field), a mix of kinds is refused;
    one plain file is one document, too few to split, and the error names data.sample_by (a smaller val_every cannot
    split one document)."""
    js = tmp_path / "d.jsonl"
    js.write_text("".join(json.dumps({"text": f"row {i} " * 5}) + "\n" for i in range(40)))
    info = data_lib.prepare({"name": "text", "files": str(js), "format": "auto", "tokenizer": "byte",
                             "cache_dir": str(tmp_path / "c")}, progress=False)
    assert info.tokenizer.decode(read_shard(info.val_shards[0])[:6]) == "row 19"  # the field, not the JSON
    (tmp_path / "one.txt").write_text("First paragraph, quite long.\n\n" * 60)
    with pytest.raises(ValueError, match=r"data.files mixes JSON-lines \(.jsonl, .json\) and text files"):
        data_lib.prepare({"name": "text", "files": [str(js), str(tmp_path / "one.txt")], "format": "auto",
                          "cache_dir": str(tmp_path / "m")}, progress=False)
    with pytest.raises(ValueError) as e:  # one document: no data.val_every holds one out (issue #76 said "at most 2")
        data_lib.prepare({"name": "text", "files": str(tmp_path / "one.txt"), "format": "auto", "tokenizer": "byte",
                          "cache_dir": str(tmp_path / "o")}, progress=False)
    msg = str(e.value)
    assert msg.startswith("data=text: 1 document is too few for a train/validation split") and (
        "use data.sample_by=paragraph (or line) to cut the files into more documents, or more documents" in msg)
    assert "val_every (at most" not in str(e.value)
    info = data_lib.prepare({"name": "text", "files": str(tmp_path / "one.txt"), "sample_by": "paragraph",
                             "tokenizer": "byte", "cache_dir": str(tmp_path / "p")}, progress=False)
    assert info.n_val_tokens > 0 and info.n_train_tokens > 0


def test_a_validation_split_too_short_for_a_window_names_data_val_every(tmp_path):
    docs = tmp_path / "docs"
    docs.mkdir()
    for i in range(40):
        (docs / f"{i:02d}.txt").write_text(f"Document {i}. " + "words " * 30)
    info = data_lib.prepare({"name": "text", "files": str(docs / "*.txt"), "tokenizer": "byte", "val_every": 20,
                             "cache_dir": str(tmp_path / "c")}, progress=False)
    assert len(info.windows("train", 1000)) >= 1  # the training split fills windows of 1001 tokens
    with pytest.raises(ValueError, match=rf"the validation split \({info.n_val_tokens:,} tokens, every "
                                         r"data.val_every-th document .* does not fill one window of 1001 tokens: "
                                         r"hold out more documents \(a smaller data.val_every"):
        info.windows("val", 1000)


def test_hub_tokenizer_offline_fails_clearly(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(RuntimeError, match="could not load tokenizer 'gpt2'.*Offline"):
        load_pretrained("gpt2")


def test_byte_tokenizer_round_trip():
    tok = Tokenizer("byte")
    s = "héllo, wörld"
    assert tok.decode(tok.encode(s)) == s and tok.vocab_size == 257


# ------------------------------------------------------------------------------ FineWeb, resumable writing, LongCrawl64
WORDS = "the of and to in a is that for it as was with be by on not he this are or his from at which but".split()


def _fineweb_rows(n, seed=0):
    rng = np.random.default_rng(seed)
    return [{"text": " ".join(rng.choice(WORDS, rng.integers(5, 60))), "id": f"<urn:{seed}-{i}>", "url": "u"}
            for i in range(n)]


def _split_tokens(info):
    return (np.concatenate([read_shard(p) for p in info.train_shards]),
            np.concatenate([read_shard(p) for p in info.val_shards]))


@pytest.mark.slow
def test_fineweb_from_local_parquet_and_jsonl_in_worker_processes(tmp_path):
    """data=fineweb on local files of the published format: the shards hold every document, in order, each followed
    by end-of-text, every 10th held out; parquet and JSON lines give the same tokens; 2 worker processes."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    from conftest import compose
    rows = [_fineweb_rows(150, s) for s in range(2)]
    for s, part in enumerate(rows):
        pq.write_table(pa.Table.from_pylist(part), tmp_path / f"{s:03d}_00000.parquet")
        (tmp_path / f"{s:03d}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in part))
    docs = [r["text"] for part in rows for r in part]
    common = ["data.tokenizer=byte", "data.val_every=10", "data.shard_tokens=3000", "data.workers=2",
              f"data.cache_dir={tmp_path / 'cache'}"]
    info = data_lib.prepare(compose(["data=fineweb", f"data.files={tmp_path}/*.parquet", *common]).data, progress=False)
    expect = {k: np.concatenate([list(d.encode()) + [256] for i, d in enumerate(docs) if (i % 10 == 9) == (k == "val")])
              for k in ("train", "val")}
    train, val = _split_tokens(info)
    assert np.array_equal(train, expect["train"]) and np.array_equal(val, expect["val"])
    assert len(info.train_shards) > 3 and len(info.val_shards) == len(info.train_shards)
    js = data_lib.prepare(compose(["data=fineweb_edu", f"data.files={tmp_path}/*.jsonl", *common]).data, progress=False)
    assert all(np.array_equal(a, b) for a, b in zip(_split_tokens(js), (train, val)))
    assert "fineweb_edu-" in js.dir
    x, y = info.windows("train", 64, seed=0).batch([0, 1])
    assert x.shape == (2, 64) and torch_equal(x[:, 1:], y[:, :-1])
    with pytest.raises(ValueError, match="all be .parquet or all JSON lines"):
        data_lib.prepare(compose(["data=fineweb", f"data.files=[{tmp_path}/000_00000.parquet,{tmp_path}/000.jsonl]",
                                  *common]).data, progress=False)
    with pytest.raises(ValueError, match="text_field='body' is not a column"):
        data_lib.prepare(compose(["data=fineweb", f"data.files={tmp_path}/*.parquet", "data.text_field=body",
                                  *common]).data, progress=False)


def torch_equal(a, b):
    return bool((a == b).all())


def test_fineweb_from_the_hub_offline_fails_clearly(tmp_path):
    from conftest import compose
    with pytest.raises(RuntimeError, match="needs the Hugging Face hub.*data.files"):
        data_lib.prepare(compose(["data=fineweb", "data.tokenizer=byte", f"data.cache_dir={tmp_path}"]).data)


def test_interrupted_preparation_resumes_to_the_same_shards(tmp_path):
    """Killed mid-stream, prepare leaves only whole shards and progress.json; the next run continues from there and
    ends with exactly the shards of an uninterrupted run."""
    docs = [r["text"] for r in _fineweb_rows(400)]

    def dying(n):
        for i, d in enumerate(docs):
            if i == n:
                raise KeyboardInterrupt
            yield d

    tok = Tokenizer("byte")
    whole, cut = tmp_path / "whole", tmp_path / "cut"
    whole.mkdir(), cut.mkdir()
    ref = data_lib.write_shards(iter(docs), tok, whole, 7, 2500, progress=False)
    with pytest.raises(KeyboardInterrupt):
        data_lib.write_shards(dying(350), tok, cut, 7, 2500, progress=False)
    state = json.loads((cut / "progress.json").read_text())
    assert 0 < state["next_doc"] <= 350 and state["shards"]["train"]
    assert not list(cut.glob("*.tmp"))
    assert sorted(p.name for p in cut.glob("*.bin")) == sorted(state["shards"]["train"] + state["shards"]["val"])
    again = data_lib.write_shards(iter(docs), tok, cut, 7, 2500, progress=False)
    assert again == ref
    for name in ref["shards"]["train"] + ref["shards"]["val"]:
        assert (cut / name).read_bytes() == (whole / name).read_bytes()


def _longcrawl(root, docs, fmt):
    root.mkdir(parents=True, exist_ok=True)
    for split, arr in docs.items():
        if fmt == "zarr":
            import zarr
            z = zarr.create_array(str(root / f"{split}.zarr"), shape=arr.shape, chunks=(1, arr.shape[1]),
                                  dtype="uint16")
            z[:] = arr
        else:
            arr.astype("<u2").tofile(root / f"{split}.bin")


@pytest.mark.parametrize("fmt", ["zarr", "bin"])
def test_longcrawl64_layout_windows_follow_the_fox_convention(tmp_path, fmt):
    """Documents of doc_len tokens -> doc_len // T windows each, never crossing documents; input = [BOS, w_0..w_{T-2}],
    target = w_0..w_{T-1}; zarr and flat uint16 files read the same; the order is a seeded permutation."""
    from conftest import compose
    rng = np.random.default_rng(0)
    docs = {"train": rng.integers(0, 200, (6, 64)), "heldout": rng.integers(0, 200, (2, 64))}
    _longcrawl(tmp_path / "lc", docs, fmt)
    cfg = compose(["data=longcrawl64", f"data.root={tmp_path / 'lc'}", "data.doc_len=64", "data.tokenizer=byte",
                   "data.bos_id=256"]).data
    info = data_lib.prepare(cfg, progress=False)
    assert (info.n_train_tokens, info.n_val_tokens, info.tokenizer.eot_id) == (6 * 64, 2 * 64, 256)
    win = info.windows("train", 24, seed=0, shuffle=False)  # 64 // 24 = 2 windows a document, 16 tokens dropped
    assert len(win) == 12
    x, y = win.batch(range(12))
    assert (x[:, 0] == 256).all() and torch_equal(x[:, 1:], y[:, :-1])
    want = np.stack([docs["train"][d, i * 24:(i + 1) * 24] for d in range(6) for i in range(2)])
    assert np.array_equal(y.numpy(), want)
    shuffled = info.windows("train", 24, seed=5)
    assert sorted(shuffled.order(g) for g in range(12)) == list(range(12))
    assert np.array_equal(info.windows("val", 64, shuffle=False).batch([1])[1].numpy()[0], docs["heldout"][1])
    with pytest.raises(ShardError, match="model.seq_len=65 is longer than the documents"):
        info.windows("train", 65)


def test_longcrawl64_bad_input_is_named(tmp_path):
    from conftest import compose

    def cfg(*extra):
        return compose(["data=longcrawl64", f"data.root={tmp_path}", "data.doc_len=64", "data.tokenizer=byte",
                        "data.bos_id=256", *extra]).data
    with pytest.raises(ShardError, match="neither train.zarr nor train.bin exists"):
        data_lib.prepare(cfg())
    np.zeros((3, 64), "<u2").tofile(tmp_path / "train.bin")
    np.zeros((1, 64), "<u2").tofile(tmp_path / "heldout.bin")
    with pytest.raises(ShardError, match="heldout.bin is truncated"):
        (tmp_path / "heldout.bin").write_bytes((tmp_path / "heldout.bin").read_bytes()[:-6])
        data_lib.prepare(cfg())
    np.full((1, 64), 300, "<u2").tofile(tmp_path / "heldout.bin")
    with pytest.raises(ShardError, match="token ids reach 300.*GPT-2 tokens"):
        data_lib.prepare(cfg())
    with pytest.raises(ShardError, match="needs data.root"):
        data_lib.prepare(compose(["data=longcrawl64"]).data)


@pytest.mark.parametrize("n,world,rows", [(3, 2, 1), (2, 4, 8), (10, 3, 2), (16, 4, 4), (0, 2, 4), (7, 1, 3)])
def test_rank_batches_cover_each_item_once_with_as_many_batches_on_every_rank(n, world, rows):
    """Evaluation under FSDP2: every rank runs the same number of forwards (empty batches pad the short ranks),
    every item is in exactly one batch, of at most `rows`, on rank item % world."""
    per_rank = [rank_batches(n, r, world, rows) for r in range(world)]
    assert len({len(b) for b in per_rank}) == 1 and len(per_rank[0]) == math.ceil(math.ceil(n / world) / rows)
    seen = sorted((i, r) for r, batches in enumerate(per_rank) for b in batches for i in b)
    assert seen == [(i, i % world) for i in range(n)] and all(len(b) <= rows for bs in per_rank for b in bs)
