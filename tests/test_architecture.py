"""The shape of the code: which package may import which (no cycles), and that the scripts stay scripts."""

import ast
from pathlib import Path

import pytest
from conftest import ROOT

# every import counts, the lazy ones inside functions too: a cycle that only bites at run time is still a cycle
PACKAGES = ["common", "kernels", "kernels.attention", "kernels.rotary", "kernels.recurrences", "kernels.path_attention",
            "kernels.linear_ce", "model", "model.core", "model.mixers", "model.pe", "data", "data.tasks", "evals",
            "trainer", "hydra_plugins.duality_launcher"]
PLUGINS = "hydra_plugins.duality_launcher"  # a real top-level package (Hydra finds launchers only there); a leaf
SCRIPTS = ["train", "eval"]
MODULES = ["hf"]  # top-level modules that scripts may import (the transformers face)


def node_of(module: str) -> str | None:
    """The package (or top-level script) a dotted module belongs to: its longest prefix among PACKAGES / SCRIPTS."""
    parts = module.removeprefix("duality.").split(".")
    for i in range(len(parts), 0, -1):
        name = ".".join(parts[:i])
        if name in PACKAGES or name in SCRIPTS or name in MODULES:
            return name
    return None


def module_name(path: Path) -> str:
    rel = path.relative_to(ROOT).with_suffix("")
    parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
    return ".".join(parts)


def imports(path: Path) -> set[str]:
    """The absolute names of the modules a file imports ("from . import x" resolved against its package)."""
    mod = module_name(path)
    package = mod if path.name == "__init__.py" else mod.rpartition(".")[0]
    out = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[:len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            out.add(base)
            out.update(f"{base}.{a.name}" for a in node.names)  # `from pkg import submodule`
    return out


def package_graph() -> dict[str, set[str]]:
    files = [ROOT / f"{s}.py" for s in SCRIPTS + MODULES]
    for pkg in PACKAGES:
        files += sorted((ROOT / pkg.replace(".", "/")).glob("*.py"))
    graph: dict[str, set[str]] = {n: set() for n in PACKAGES + SCRIPTS + MODULES}
    for f in files:
        src = node_of(module_name(f))
        for name in imports(f):
            dst = node_of(name)  # `from data import tasks`: data and data.tasks (importing it runs data/__init__)
            if dst is not None and dst != src:
                graph[src].add(dst)
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(n):
        state[n] = 1
        path.append(n)
        for m in sorted(graph[n]):
            if state.get(m) == 1:
                return path[path.index(m):] + [m]
            if m not in state and (c := visit(m)):
                return c
        state[n] = 2
        path.pop()
        return None

    for n in sorted(graph):
        if n not in state and (c := visit(n)):
            return c
    return None


def ours(path: Path) -> bool:
    """The repository's own code: not under a hidden folder (.venv, or a git-ignored checkout such as the seed's code
    that reproductions/official_ab.sh clones into .seed/) nor outputs/."""
    parts = path.relative_to(ROOT).parts
    return not any(p.startswith(".") for p in parts) and "outputs" not in parts


def test_every_package_is_listed():
    """A new package joins the check (else its imports would go unseen)."""
    found = {module_name(p.parent) for p in ROOT.glob("*/**/__init__.py") if ours(p)
             and "tests" not in p.parts and p.parent.name != "local_tasks"}
    assert found - set(PACKAGES) == set(), "add the new package to PACKAGES"


def test_no_import_cycle_between_packages():
    graph = package_graph()
    cycle = find_cycle(graph)
    assert cycle is None, "import cycle: " + " -> ".join(cycle)
    # the layering docs/layout.md describes (common < kernels < model < data < trainer < evals < scripts): nothing
    # imports the scripts, common imports nobody, the model and the data know nothing of training or evaluation
    assert not any(s in deps for deps in graph.values() for s in SCRIPTS), \
        {n: d & set(SCRIPTS) for n, d in graph.items() if d & set(SCRIPTS)}
    assert graph["common"] <= {PLUGINS} and graph[PLUGINS] == set()  # cli.py registers the launcher, a leaf
    lower = {n: graph[n] for n in ("kernels", "model", "model.mixers", "model.pe", "data", "data.tasks")}
    assert all(not deps & {"trainer", "evals"} for deps in lower.values()), lower
    assert "evals" not in graph["trainer"]
    assert not any("hf" in graph[n] for n in PACKAGES if n != "evals"), "only evals and the scripts use hf.py"


def test_every_import_of_this_repo_goes_through_the_duality_package():
    """`from model import x` would work only with the repository root on sys.path, and would load a second copy of
    the module beside duality.model (duality/__init__.py removes the root from sys.path)."""
    top = {p.split(".")[0] for p in PACKAGES if p != PLUGINS} | set(SCRIPTS) | set(MODULES)
    files = [f for f in ROOT.rglob("*.py") if ours(f)]
    bare = [f"{f.relative_to(ROOT)}: {name}" for f in files for name in absolute_imports(f)
            if name.split(".")[0] in top]
    assert bare == [], bare
    assert absolute_imports_of_source("import kernels.rotary\nfrom model import x\nfrom . import y") == [
        "kernels.rotary", "model"]


def absolute_imports(path: Path) -> list[str]:
    return absolute_imports_of_source(path.read_text())


def absolute_imports_of_source(src: str) -> list[str]:
    out = []
    for node in ast.walk(ast.parse(src)):
        if isinstance(node, ast.Import):
            out += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and not node.level:
            out.append(node.module)
    return out


def test_cycle_finder_finds_cycles():
    """The check itself can fail: a planted two-way and three-way cycle are reported."""
    assert find_cycle({"a": {"b"}, "b": {"a"}}) == ["a", "b", "a"]
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": set()}) is None


def test_train_script_is_short():
    """train.py is the loop a newcomer reads in one sitting; the parts live in trainer/."""
    assert len((ROOT / "train.py").read_text().splitlines()) <= 150


@pytest.mark.slow
def test_every_backbone_and_scheme_option_is_in_the_composed_config():
    """`train.py backbone=X --cfg job` shows every option of X with its default: the yaml preset extends the schema
    made from the constructor, so the config and the code cannot disagree on what exists; a wrong type or an unknown
    key fails while composing, naming the key."""
    import pytest
    from conftest import compose
    from hydra.errors import ConfigCompositionException

    from duality.model.core.options import defaults
    from duality.model.mixers import REGISTRY as MIXERS
    from duality.model.pe import REGISTRY as SCHEMES
    for group, registry in (("backbone", MIXERS), ("pe", SCHEMES)):
        for preset in sorted(p.stem for p in (ROOT / "conf" / group).glob("*.yaml")):
            cfg = compose([f"{group}={preset}"])[group]
            cls = registry[cfg.name]
            assert set(cfg) == {"name", *defaults(cls)}, (group, preset)
            if preset == cfg.name:  # the plain preset: a value differs from the code's default only on purpose
                changed = {k for k, v in defaults(cls).items() if cfg[k] != v}
                assert changed <= {"source", "rank"}, (preset, changed)  # Selective RoPE: the released code's form
    with pytest.raises(ConfigCompositionException, match="qk_norm"):
        compose(["backbone=fox", "backbone.qk_norm=maybe"])
    with pytest.raises(ConfigCompositionException, match="foo"):
        compose(["backbone=gla", "backbone.foo=1"])


def test_readme_overview_lists_every_config_choice():
    """The README's "What exists today" table has a row per config group naming every yaml of it (the six MAD tasks
    as `mad_*`), so a new component cannot be left out of the overview."""
    readme = (ROOT / "README.md").read_text()
    table = readme[readme.index("**What exists today**"):readme.index("## Quick start")].splitlines()
    missing = {}
    for group in sorted(p for p in (ROOT / "conf").iterdir() if p.is_dir()):
        row = next((line for line in table if line.startswith(f"| `{group.name}` |")), "")
        names = [p.stem for p in group.glob("*.yaml")]
        absent = [n for n in names if f"`{n}`" not in row and not (n.startswith("mad_") and "`mad_*`" in row)]
        if absent:
            missing[group.name] = sorted(absent)
    assert not missing, f"README overview lacks {missing}"
