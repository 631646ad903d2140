"""One way to write a figure: matplotlib's Agg backend, written atomically (a PNG is whole or absent). Without
matplotlib (a bare GPU image) nothing is drawn and the caller's JSON holds the numbers."""

from __future__ import annotations

from pathlib import Path

from .io import atomic_path


def save_figure(path, draw, figsize=(6, 3.6), ncols: int = 1, nrows: int = 1) -> Path | None:
    """draw(axes) fills a fresh figure of nrows x ncols axes (a flat list); returns the path, or None."""
    try:
        import matplotlib
    except ImportError:
        print(f"matplotlib is not installed: no {path}")
        return None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(nrows, ncols, figsize=figsize, dpi=120, squeeze=False)
    draw(list(axes.flat))
    fig.tight_layout()
    try:
        with atomic_path(path, suffix=".png") as tmp:
            fig.savefig(tmp)
    finally:
        plt.close(fig)
    return Path(path)
