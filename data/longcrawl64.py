"""`data=longcrawl64`: LongCrawl64 (Buckman 2024), documents of exactly 65,536 GPT-2 tokens, already tokenized.

Layout under data.root, one array [documents, doc_len] of uint16 tokens per split (train, heldout), either
    <split>.zarr   the published zarr arrays (train: 6,609,334 documents, heldout: 52,131), read with `zarr`
    <split>.bin    the same tokens as one flat little-endian uint16 file, document after document, no header
scripts/download_longcrawl64.sh fetches the zarr arrays and can flatten them
(`python -m duality.data.longcrawl64 flatten`).

Windows, as in the FoX code: document d gives doc_len // T windows of T consecutive tokens w_0..w_{T-1} (tokens past
the last whole window are dropped); the model reads [BOS, w_0, ..., w_{T-2}] and predicts w_0..w_{T-1}, with BOS =
data.bos_id (50256, GPT-2's <|endoftext|>). Windows never cross documents, and each starts a fresh sequence, so a
context of T = 65,536 is one whole document. The order of windows is seeded per epoch, as for token shards.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

from duality.common.io import atomic_open

from .shards import EpochOrder, ShardError, TokenWindows
from .tokenizer import Tokenizer, make_tokenizer

SPLITS = {"train": "train", "val": "heldout"}


def _open(root: Path, split: str, doc_len: int):
    z, flat = root / f"{split}.zarr", root / f"{split}.bin"
    if z.exists():
        try:
            import zarr
        except ImportError:
            raise ShardError(f"{z} is a zarr array: pip install zarr, or flatten it elsewhere with "
                             "`python -m duality.data.longcrawl64 flatten` (data/longcrawl64.py)") from None
        arr = zarr.open(str(z), mode="r")
    elif flat.exists():
        size = flat.stat().st_size
        if size == 0 or size % (2 * doc_len):
            raise ShardError(f"{flat} is truncated or not LongCrawl64: {size} bytes is not a whole number of "
                             f"documents of {doc_len} uint16 tokens; download it again "
                             "(scripts/download_longcrawl64.sh)")
        arr = np.memmap(flat, dtype=np.uint16, mode="r", shape=(size // (2 * doc_len), doc_len))
    else:
        raise ShardError(f"data.root={root}: neither {z.name} nor {flat.name} exists there; download LongCrawl64 with "
                         "scripts/download_longcrawl64.sh, or point data.root at the folder that holds them")
    if arr.ndim != 2 or arr.shape[1] != doc_len:
        raise ShardError(f"{root / split}: shape {tuple(arr.shape)}, expected [documents, {doc_len}] (data.doc_len)")
    return arr


def open_arrays(cfg: dict, tokenizer: Tokenizer | None = None):
    """The train / held-out arrays as a DataInfo (nothing is copied or tokenized)."""
    from . import DataInfo
    if not cfg.get("root"):
        raise ShardError("data=longcrawl64 needs data.root=<folder with train.zarr / heldout.zarr or .bin files>")
    root, doc_len = Path(cfg["root"]).expanduser(), int(cfg.get("doc_len", 65536))
    arrays = {s: _open(root, name, doc_len) for s, name in SPLITS.items()}
    # a copy of a given tokenizer (a checkpoint's): its end-of-text id is set to the BOS below
    tok = (Tokenizer.from_dict(tokenizer.to_dict()) if tokenizer
           else make_tokenizer(cfg.get("tokenizer", "gpt2"), None, 0))
    sample = max(int(np.asarray(a[:4]).max()) for a in arrays.values())  # the first documents of each split
    if sample >= tok.vocab_size or int(cfg.get("bos_id", 50256)) >= tok.vocab_size:
        raise ShardError(f"{root}: token ids reach {sample} (BOS {cfg.get('bos_id', 50256)}), the tokenizer "
                         f"{cfg.get('tokenizer')!r} has {tok.vocab_size}: LongCrawl64 is GPT-2 tokens, use "
                         "data.tokenizer=gpt2 (or a local copy of its tokenizer.json)")
    tok.eot_id = int(cfg.get("bos_id", 50256))
    n = {s: int(a.shape[0]) * doc_len for s, a in arrays.items()}
    return DataInfo([], [], tok, n["train"], n["val"], str(root), arrays)


class DocWindows:
    """Windows of T tokens within fixed-length documents, returned as T + 1 tokens [BOS, w_0..w_{T-1}] so that the
    loader's (input, shifted target) split gives the FoX convention. Same interface as shards.TokenWindows."""

    def __init__(self, array, seq_len: int, bos: int, seed: int = 0, shuffle: bool = True, name: str = "data"):
        n_docs, doc_len = array.shape
        if seq_len > doc_len:
            raise ShardError(f"{name}: model.seq_len={seq_len} is longer than the documents ({doc_len} tokens); "
                             f"a window never crosses documents, so use model.seq_len <= {doc_len}")
        self.array, self.seq_len, self.bos = array, seq_len, bos
        self.per_doc = doc_len // seq_len
        self.order = EpochOrder(n_docs * self.per_doc, seed, shuffle)

    def __len__(self):
        return self.order.n

    def window(self, g: int) -> np.ndarray:
        doc, i = divmod(self.order(g), self.per_doc)
        w = np.asarray(self.array[doc, i * self.seq_len:(i + 1) * self.seq_len], dtype=np.int64)
        return np.concatenate([[self.bos], w])

    batch = TokenWindows.batch  # (inputs, shifted targets) of the windows of these global samples


def flatten(root: str, doc_len: int = 65536, rows: int = 256) -> None:
    """<split>.zarr -> <split>.bin (written to a temporary name and renamed, so a partial file is never read)."""
    import zarr
    from tqdm import tqdm
    for split in SPLITS.values():
        src = zarr.open(str(Path(root) / f"{split}.zarr"), mode="r")
        out = Path(root) / f"{split}.bin"
        with atomic_open(out, "wb") as f:
            for i in tqdm(range(0, src.shape[0], rows), desc=f"flattening {split}", unit="block"):
                f.write(np.asarray(src[i:i + rows], dtype="<u2").tobytes())


if __name__ == "__main__":
    if len(sys.argv) < 3 or sys.argv[1] != "flatten":
        sys.exit("usage: python -m duality.data.longcrawl64 flatten <root with train.zarr and heldout.zarr>")
    flatten(sys.argv[2])
