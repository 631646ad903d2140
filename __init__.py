"""duality: sequence mixers and positional schemes on one GPT trunk.

The repository's folders are this package's modules (`duality.model`, `duality.kernels`, ...; pyproject.toml maps
them), never top-level names: `kernels` is Hugging Face's kernel-hub package, and `model` or `data` could be anyone's.
`import duality.hf` registers the transformers classes (model_type "duality") with the Auto classes.
"""

import os
import sys

# A script at the repository root (python train.py) or `python -m` from it puts the root on sys.path, which would
# make its folders importable as top-level `kernels`, `model`, ... (a second copy of each module, and a `kernels` that
# shadows Hugging Face's for transformers). Every import here goes through `duality.`, so the entry can go.
_ROOT = os.path.dirname(os.path.realpath(__file__))
sys.path[:] = [p for p in sys.path if os.path.realpath(p or os.curdir) != _ROOT]
