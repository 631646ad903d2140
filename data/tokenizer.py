"""Tokenizers: `bpe` (a byte-level BPE trained locally with Hugging Face `tokenizers`, seconds on a CPU), `byte`
(256 byte values + end-of-text), or any Hugging Face tokenizer by name or by local tokenizer.json path.
`symbols` names the tokens of a synthetic task (data/tasks/): text is the names separated by spaces.
The chosen tokenizer is serialised into every checkpoint, so evaluation and sampling never need the data again."""

from __future__ import annotations

import json
from pathlib import Path

EOT = "<|endoftext|>"


class Tokenizer:
    def __init__(self, kind: str, spec: str | None = None):
        self.kind, self.spec = kind, spec
        if kind == "byte":
            self.vocab_size, self.eot_id = 257, 256
            return
        if kind == "symbols":
            self.names = json.loads(spec)
            self._ids = {n: i for i, n in enumerate(self.names)}
            self.vocab_size = len(self.names)
            self.eot_id = next((self._ids[n] for n in ("<eos>", "<pad>") if n in self._ids), 0)
            return
        from tokenizers import Tokenizer as HFTokenizer
        self._tok = HFTokenizer.from_str(spec)
        self.vocab_size = self._tok.get_vocab_size()
        for name in (EOT, "</s>", "<eos>", "[SEP]"):
            if self._tok.token_to_id(name) is not None:
                self.eot_id = self._tok.token_to_id(name)
                break
        else:
            raise ValueError("the tokenizer has no end-of-text token (looked for <|endoftext|>, </s>, <eos>, [SEP])")

    def encode(self, text: str) -> list[int]:
        if self.kind == "byte":
            return list(text.encode("utf-8"))
        if self.kind == "symbols":
            bad = [w for w in text.split() if w not in self._ids]
            if bad:
                raise ValueError(f"unknown token(s) {bad[:5]}; this task's tokens are {self.names[:40]}"
                                 + (" ..." if len(self.names) > 40 else ""))
            return [self._ids[w] for w in text.split()]
        return self._tok.encode(text).ids

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        if self.kind in ("byte", "symbols"):
            return [self.encode(t) for t in texts]
        return [e.ids for e in self._tok.encode_batch(texts)]

    def decode(self, ids) -> str:
        ids = [int(i) for i in ids]
        if self.kind == "byte":
            return bytes(i for i in ids if i < 256).decode("utf-8", errors="replace")
        if self.kind == "symbols":
            return " ".join(self.names[i] if i < len(self.names) else f"<{i}>" for i in ids)
        return self._tok.decode(ids)

    def to_hf(self):
        """The same tokenizer as a Hugging Face `tokenizers.Tokenizer` (equal ids and text), for the transformers export
        (hf.py): byte -> byte-level BPE without merges (byte b is id b), symbols -> a word-level vocabulary."""
        from tokenizers import Tokenizer as HFTokenizer
        from tokenizers import decoders, models, pre_tokenizers
        if self.kind == "byte":
            tok = HFTokenizer(models.BPE(vocab={c: b for b, c in _byte_chars().items()}, merges=[]))
            tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
            tok.decoder = decoders.ByteLevel()
            tok.add_special_tokens([EOT])  # id 256
            return tok
        if self.kind == "symbols":
            tok = HFTokenizer(models.WordLevel(vocab=dict(self._ids), unk_token=None))
            tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
            return tok
        return HFTokenizer.from_str(self.spec)

    def to_dict(self) -> dict:
        return {"kind": self.kind, "spec": self.spec}

    @classmethod
    def from_dict(cls, d: dict) -> "Tokenizer":
        return cls(d["kind"], d.get("spec"))


def _byte_chars() -> dict[int, str]:
    """GPT-2's byte -> printable character map, which byte-level BPE vocabularies are written in: printable bytes
    stand for themselves, the others for the characters from U+0100 on, in byte order."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    extra = iter(range(256, 512))
    return {b: chr(b if b in printable else next(extra)) for b in range(256)}


def train_bpe(texts, vocab_size: int) -> Tokenizer:
    from tokenizers import ByteLevelBPETokenizer
    tok = ByteLevelBPETokenizer()
    tok.train_from_iterator(texts, vocab_size=vocab_size, min_frequency=2, special_tokens=[EOT], show_progress=False)
    return Tokenizer("bpe", tok._tokenizer.to_str())


def load_pretrained(name: str) -> Tokenizer:
    """A local tokenizer.json path or a folder holding one (a transformers export, a hub snapshot), or a hub name
    (needs the network once, then the hub cache)."""
    if Path(name).is_file():
        return Tokenizer("hf", Path(name).read_text())
    if (Path(name) / "tokenizer.json").is_file():
        return Tokenizer("hf", (Path(name) / "tokenizer.json").read_text())
    from tokenizers import Tokenizer as HFTokenizer
    try:
        tok = HFTokenizer.from_pretrained(name)
    except Exception as e:  # the hub client raises many kinds of errors when offline
        from duality.common.errors import HubUnavailable
        raise HubUnavailable(
            f"could not load tokenizer {name!r} from the Hugging Face hub ({type(e).__name__}: {e}). Offline? "
            "Pass a local tokenizer.json path or a folder holding one, or data.tokenizer=bpe to train one here, "
            "or data.tokenizer=byte."
        ) from None
    return Tokenizer("hf", tok.to_str())


def make_tokenizer(kind: str, texts, vocab_size: int) -> Tokenizer:
    if kind == "bpe":
        return train_bpe(texts, vocab_size)
    if kind == "byte":
        return Tokenizer("byte")
    return load_pretrained(kind)
