"""Prepare a data config's shards ahead of training (train.py would do the same on rank 0 at start-up, but a
FineWeb sample takes hours and wants many processes, not a GPU job waiting on a barrier).

    python data/prepare.py data=fineweb data.sample=sample-10BT data.workers=32
    python data/prepare.py data=fineweb data.files='/data/fineweb/sample/10BT/*.parquet' data.tokenizer=gpt2

Same Hydra config as train.py, so `train.py data=fineweb <same data.* overrides>` finds the result in the cache.
Interrupt it at any time: the next run continues from the last complete shard (data/__init__.py).
"""


def run(cfg):
    from duality import data
    info = data.prepare(cfg.data, progress=cfg.train.progress)
    print(f"{cfg.data.name}: {info.n_train_tokens:,} train / {info.n_val_tokens:,} val tokens, vocabulary "
          f"{info.tokenizer.vocab_size}, in {info.dir}")
    return info


if __name__ == "__main__":
    from duality import model  # noqa: F401  (registers the backbone / pe schemas that the config composes)
    from duality.common.cli import cli
    cli(run, "config", script="prepare")
