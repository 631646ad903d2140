"""The training library under train.py, one component per file; none of them knows which model it trains or which
of the others exists (train.py wires them together; its Hydra entry point is common/cli.py):

    config.py       check_config: everything checkable before work starts, and the numbers it derives
    runtime.py      Runtime: rank, world, device, autocast; DDP / FSDP2 wrapping; model and optimizer state
    checkpoint.py   save / resolve / load / compatibility of checkpoints, load_model, the run lock
    optim.py        AdamW with decay groups, the learning-rate schedules, one optimizer step
    objective.py    what a run trains toward and how it is scored: text (validation loss, a sample) or a
                    synthetic task (accuracy by length, stop at an accuracy)
    logger.py       metrics.jsonl + wandb + the console line; throughput and MFU
    profiling.py    train.profile_steps: a torch.profiler trace
"""
