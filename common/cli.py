"""The Hydra entry point of train.py, eval.py and data/prepare.py: bad input ends in one `error: ...` line and exit
code 2, never a traceback."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from .errors import USER_ERRORS, ConfigError, describe_storage, storage_cause

CONF = Path(__file__).resolve().parent.parent / "conf"


def cli(run_fn, config_name: str):
    import hydra

    # an absolute path: with the repo pip-installed, Hydra would read a relative config_path as a Python package
    @hydra.main(config_path=str(CONF), config_name=config_name, version_base="1.3")
    def _main(cfg):
        try:
            return run_fn(cfg)
        except USER_ERRORS as e:
            # a config error is every rank's under torchrun: rank 0 says it; other errors may be one rank's own
            if os.environ.get("RANK", "0") == "0" or not isinstance(e, ConfigError):
                print(f"error: {e}", file=sys.stderr)
            sys.exit(2)
        except (OSError, RuntimeError) as e:  # a place that cannot be written: one line, the path and the cause
            if (cause := storage_cause(e)) is None:
                raise
            print(f"error: {describe_storage(cause)}", file=sys.stderr)
            sys.exit(2)

    _main()
