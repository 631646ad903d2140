"""The README's and docs' commands are real: every train.py, eval.py and data/prepare.py line of their code blocks
composes with the configs as written (an unknown key or choice fails here, not on a user's GPU node), every train.py
line passes the checks train.py makes before work starts (or fails with the error its page shows), and the README
stays a short guide (measurements live in docs/)."""

import re
import shlex

import pytest
from conftest import ROOT, compose, sweep_job

from duality import eval as eval_lib
from duality.trainer.config import check_config

README = (ROOT / "README.md").read_text()


def commands(text: str) -> list[tuple[str, str | None]]:
    """(command, the error it is shown with or None) for every command line of a page's code blocks: continuations
    joined, comments, prompts, pipes and Hydra's `--cfg job` dropped; lines with shell variables left out."""
    out = []
    for block in re.findall(r"^```\w*\n(.*?)^```", text, re.S | re.M):
        lines = block.replace("\\\n", " ").splitlines()
        for i, line in enumerate(lines):
            line = line.removeprefix("$ ")
            if not re.match(r"(make|python|torchrun|sbatch|lm_eval|bash|git)\b", line) or "$" in line.split("#")[0]:
                continue
            line = re.sub(r"\s+#\s.*$", "", line).split(" | ")[0].replace(" --cfg job", "").strip()
            after = lines[i + 1] if i + 1 < len(lines) else ""
            out.append((line, after if re.match(r"(error:|Error merging)", after) else None))
    return out


def overrides(line: str, script: str) -> tuple[list[str], int]:
    """(Hydra overrides after `script` on this line, world size), one value of each multirun list, Hydra's own
    launcher keys left out; a `--wrap "srun python train.py ..."` is read inside."""
    words = shlex.split(line)
    for w in words:
        if script in w and w != script and " " in w:
            return overrides(w, script)
    world = 1
    for w in words:
        if m := re.match(r"--(nproc_per_node|nnodes)=(\d+)", w):
            world *= int(m.group(2))
    args = words[words.index(script) + 1:] if script in words else words[2:]
    picked = []
    for a in args:
        if a == "-m" or a.startswith(("hydra", "--")):  # Hydra's own flags (--help, --cfg) and launcher keys
            continue
        key, _, value = a.partition("=")
        if "," in value and not value.startswith(("[", "'[")):
            value = value.split(",")[0]
        picked.append(f"{key}={value}")
    return picked, world


CMDS = [c for c, _ in commands(README)]
DOCS = {p: commands(p.read_text()) for p in sorted(ROOT.glob("docs/**/*.md"))}
ALL = [(c, err) for c, err in commands(README)] + [(c, err) for cmds in DOCS.values() for c, err in cmds]
TRAIN = [(c, e) for c, e in ALL if re.search(r"(python|torchrun).*\btrain\.py\b", c) or c.startswith("make train")]
EVAL = [(c, e) for c, e in ALL if re.search(r"python.*\beval\.py\b", c)]
PREPARE = [c for c, _ in ALL if "data/prepare.py" in c]


def test_the_readme_has_the_recipes_a_user_needs():
    """A short guide: each recipe's command is there, the page stays under 350 lines, and no issue numbers."""
    assert len(README.splitlines()) <= 350
    for needle in ("torchrun --nproc_per_node", "--nnodes=2", "sbatch", "submitit_slurm", "data/prepare.py",
                   "data=longcrawl64", "sweep=parity", "mode=position_loss", "mode=lm_eval", "mode=export",
                   "lm_eval --model hf", "WANDB_MODE"):
        assert any(needle in c for c in CMDS) or needle in README, needle
    assert not re.search(r"(issue|#)\s?#?\d{2}\b", README.split("## Results")[0]), "issue numbers in the README"
    assert len([c for c in CMDS if "train.py" in c]) >= 10 and len([c for c in CMDS if "eval.py" in c]) >= 4


def train_plan(line: str) -> dict:
    ov, world = overrides(line, "train.py" if "train.py" in line else "train")
    if "-m" in shlex.split(line):
        ov = sweep_job(ov)
    return check_config(compose(ov), world)


@pytest.mark.parametrize("line, error", TRAIN)
def test_train_commands_compose_and_pass_the_checks(line, error):
    """README and docs/: each train.py command composes and passes train.py's checks, or, where a page shows it with
    its error, fails with that error."""
    if error:
        with pytest.raises(Exception, match=re.escape(error.removeprefix("error: ")[:40])):
            train_plan(line)
        return
    plan = train_plan(line)
    assert plan["grad_accum"] >= 1 and (plan["steps"] is None or plan["steps"] >= 1)  # tasks: epochs, counted from data


@pytest.mark.parametrize("line, error", EVAL)
def test_eval_commands_compose(line, error):
    cfg = compose(overrides(line, "eval.py")[0], config_name="eval")
    assert error is None
    assert cfg.mode in eval_lib.MODES


@pytest.mark.parametrize("line", PREPARE)
def test_prepare_commands_compose(line):
    cfg = compose(overrides(line, "data/prepare.py")[0])
    assert cfg.data.name


def slug(heading: str) -> str:
    """GitHub's anchor for a Markdown heading."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def test_links_resolve():
    """Every relative link of the README and docs/ names a file that exists, and every anchor of the README's links
    (its generated tables' included) names a heading of its page."""
    broken = []
    for page in [ROOT / "README.md", *ROOT.glob("docs/**/*.md")]:
        for target in re.findall(r"\]\(([^)\s]+)\)", page.read_text()):
            if target.startswith(("http", "#", "mailto:")):
                continue
            path, _, anchor = target.partition("#")
            dest = (page.parent / path).resolve()
            if not dest.exists():
                broken.append(f"{page.relative_to(ROOT)}: {target}")
            elif anchor and page.name == "README.md" and page.parent == ROOT:
                headings = {slug(h) for h in re.findall(r"^#+ (.*)$", dest.read_text(), re.M)}
                if anchor not in headings:
                    broken.append(f"README.md: {target} (no such heading)")
    assert not broken, broken
