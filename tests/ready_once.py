"""A `hydra.launcher.ready` for tests/test_results.py's allocation test: the seeds launch that asks first holds its
seeds jobs (WAITING) whatever the grid's state, so the allocation script's second round for waiting jobs is met on
every run, not only when the grid's last run happens to outlast the 20 s before the seeds launch. Later launches ask
the repo's own check (common/grid.py)."""

import os
from pathlib import Path

from duality.common.grid import grid_not_over


def seeds_wait_in_the_first_launch(cfg) -> str | None:
    if cfg.seed == 0:  # a grid job
        return None
    mark = Path(os.environ["SWEEPS_DIR"]) / "first_seeds_launch"  # that launch's process id
    if not mark.exists():
        mark.write_text(str(os.getpid()))
    return "held in the first seeds launch" if mark.read_text() == str(os.getpid()) else grid_not_over(cfg)
