"""wandb's own environment variables are honoured (trainer/logger.py: wandb_init), offline: the mode, project, name,
group and folder a user's environment gives win over this repo's defaults; a value set in the config wins over both;
an unreachable server is one warning and an offline run."""

import time

import pytest
from conftest import compose, tiny_overrides

from duality import train as train_lib

ENV = ("WANDB_MODE", "WANDB_API_KEY", "WANDB_PROJECT", "WANDB_ENTITY", "WANDB_NAME", "WANDB_RUN_GROUP", "WANDB_DIR")


@pytest.fixture
def env(monkeypatch):
    for var in ENV:
        monkeypatch.delenv(var, raising=False)
    return monkeypatch


def train(out, cache, *extra):
    args = [a for a in tiny_overrides(out, cache, "train.steps=2", *extra) if a != "logger.mode=disabled"]
    return train_lib.run(compose(args))


def run_files(folder):
    return sorted(folder.glob("wandb/offline-run-*/run-*.wandb"))


def run_data(path, expected: bytes, timeout: float = 60.0) -> bytes:
    """The run file's bytes once they hold `expected`: wandb's service may still be writing them after finish()
    returns (seen on a loaded machine: the header alone), so wait for it rather than read too early."""
    deadline = time.monotonic() + timeout
    while expected not in (data := path.read_bytes()) and time.monotonic() < deadline:
        time.sleep(0.2)
    return data


def test_wandb_mode_disabled_in_the_environment_writes_no_run(tmp_path, data_cache, env):
    env.setenv("WANDB_MODE", "disabled")
    train(tmp_path / "run", data_cache)  # logger.mode=auto
    assert not (tmp_path / "run" / "wandb").exists() and (tmp_path / "run" / "metrics.jsonl").exists()


def test_wandb_mode_offline_wins_over_a_key_in_the_environment(tmp_path, data_cache, env):
    env.setenv("WANDB_MODE", "offline")
    env.setenv("WANDB_API_KEY", "x" * 40)  # a key on an offline compute node: no attempt to go online
    train(tmp_path / "run", data_cache)
    assert len(run_files(tmp_path / "run")) == 1


def test_project_name_group_and_dir_come_from_the_environment_unless_the_config_sets_them(tmp_path, data_cache, env):
    env.setenv("WANDB_MODE", "offline")
    for var, value in (("WANDB_PROJECT", "proj-from-env"), ("WANDB_NAME", "name-from-env"),
                       ("WANDB_RUN_GROUP", "group-from-env"), ("WANDB_DIR", str(tmp_path / "wandb-dir"))):
        env.setenv(var, value)
    train(tmp_path / "a", data_cache)
    assert not (tmp_path / "a" / "wandb").exists()
    (found,) = run_files(tmp_path / "wandb-dir")
    data = run_data(found, b"group-from-env")
    assert b"proj-from-env" in data and b"name-from-env" in data and b"group-from-env" in data
    train(tmp_path / "b", data_cache, "logger.project=proj-from-config", "logger.run_name=name-from-config")
    (second,) = [f for f in run_files(tmp_path / "wandb-dir") if f != found]
    data = run_data(second, b"name-from-config")
    assert b"proj-from-config" in data and b"name-from-config" in data and b"proj-from-env" not in data


def test_an_unreachable_server_is_a_warning_and_an_offline_run(tmp_path, data_cache, env, capsys):
    import wandb
    real = wandb.init

    def no_server(*a, mode=None, **kw):
        if mode == "online":
            raise wandb.errors.CommError("Failed to get resume status")
        return real(*a, mode=mode, **kw)
    env.setattr(wandb, "init", no_server)
    train(tmp_path / "run", data_cache, "logger.mode=online")
    err = capsys.readouterr().err
    assert "warning: wandb could not reach its server (CommError: Failed to get resume status); logging offline" in err
    assert len(run_files(tmp_path / "run")) == 1
