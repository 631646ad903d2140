"""Train a GPT whose token mixer and positional scheme come from the config.

    python train.py                                          # transformer + RoPE, tiny, embedded corpus
    python train.py backbone=linear_attn pe=nope train.steps=50
    python train.py -m pe=nope,rope,alibi optim.lr=1e-3,2e-3  # Hydra multirun sweep
    torchrun --nproc_per_node=8 train.py model=124m data=text data.files='corpus/*.txt'

This file is the loop; the parts it wires together live in trainer/ and know nothing of each other: the model comes
from model/ (backbone, pe and model groups), the data and its scoring from an objective (text or a synthetic task).
Everything a run makes goes to out_dir: checkpoints/ (atomic, `latest` points at the newest), metrics.jsonl
(every logged number), and wandb/ (offline unless you are logged in).
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
from omegaconf import OmegaConf
from tqdm import tqdm

from duality.common.cli import cli
from duality.model import build_model
from duality.trainer import objective as objectives
from duality.trainer.checkpoint import Checkpointer, RunLock, find_resume, load_weights, schedule_horizon
from duality.trainer.config import check_config
from duality.trainer.guard import NonFiniteGuard
from duality.trainer.logger import Logger, StepMeter, default_out_dir
from duality.trainer.optim import make_optimizer, make_schedule, train_step
from duality.trainer.preempt import StopSignals
from duality.trainer.profiling import Profiler
from duality.trainer.runtime import Runtime


def run(cfg) -> dict:
    """Train as the config says; returns the final metrics. Raises ConfigError / ShardError on bad input and
    NonFinite when a step goes non-finite (train.nonfinite=stop). The out_dir's lock is released however it ends."""
    lock, stop = None, StopSignals(cfg.train.get("stop_signals"))  # noted from now, acted on after the step
    try:
        t = cfg.train
        plan = check_config(cfg, Runtime.world_size())
        rt = Runtime.start(cfg)
        out_dir = Path(cfg.out_dir) if cfg.out_dir else default_out_dir(cfg)
        if rt.master:  # one run per out_dir, before anything is read or written there
            lock = RunLock(out_dir).acquire()
        ckpt_path, ckpt = find_resume(cfg, out_dir)  # a bad checkpoint fails before data preparation

        objective = objectives.build(cfg, rt, plan["grad_accum"])
        steps = plan["steps"] or objective.steps_for_epochs(t.epochs)
        batch_tokens = t.micro_batch * plan["grad_accum"] * rt.data_world * objective.seq_len
        head = objective.head if cfg.model.head == "auto" else cfg.model.head
        run_cfg = OmegaConf.to_container(cfg, resolve=True)
        run_cfg["model"]["head"] = head  # the head it is built with: a checkpoint rebuilds the same model
        torch.manual_seed(cfg.seed)
        model = build_model(cfg.backbone, cfg.pe, run_cfg["model"], objective.vocab_size).to(rt.device)
        if ckpt is not None and "model" in ckpt:  # into the whole model, before FSDP shards it (sharded: restore)
            load_weights(model, ckpt["model"], ckpt_path)
        model.set_activation_checkpointing(t.activation_checkpointing, t.compile, t.compile_mode)  # pre-compile, FSDP
        rt.prepare(model)
        optimizer = make_optimizer(model, cfg.optim, fused=rt.cuda)
        scheduler = make_schedule(optimizer, cfg.optim, schedule_horizon(ckpt, cfg, steps))  # resume: its horizon
        meta = {"config": run_cfg, "tokenizer": objective.tokenizer.to_dict(), "vocab_size": objective.vocab_size}
        saver = Checkpointer(out_dir, rt, model, optimizer, scheduler, meta, t.keep_checkpoints, ckpt_path,
                             t.checkpoint_format, t.async_checkpoint)
        start = saver.restore(ckpt, cfg.seed)
        if ckpt is not None and ckpt.get("stopped_at_acc") is not None and t.get("stop_acc") is not None:
            steps = start  # it stopped at train.stop_acc: nothing left to train (train.stop_acc=null trains on)
            if rt.master:
                print(f"this run stopped at step {start} with accuracy {ckpt['stopped_at_acc']:.4f} >= "
                      "train.stop_acc; nothing to do (train.stop_acc=null trains on)")
        train_model = rt.wrap(model, t.compile, t.compile_mode, t.compile_scope)

        if rt.master:
            (out_dir / "config.yaml").write_text(OmegaConf.to_yaml(run_cfg))
            print(f"out_dir: {out_dir}")
            print(f"model: backbone={cfg.backbone.name} pe={cfg.pe.name} size={cfg.model.name}: "
                  f"{model.num_params() / 1e6:.2f}M parameters ({model.num_params(True) / 1e6:.2f}M without "
                  f"embeddings), vocab {objective.tokenizer.vocab_size} (padded {objective.vocab_size})")
            print(objective.describe())
            print(f"train: {steps} steps x {batch_tokens:,} tokens = {steps * batch_tokens:,} tokens; micro_batch "
                  f"{t.micro_batch} x grad_accum {plan['grad_accum']} x {rt.describe()}"
                  + (f"; resuming at step {start}" if start else ""))
        logger = Logger(cfg, out_dir, rt.master, ckpt.get("wandb_id") if ckpt else None, start)
        meter = StepMeter(rt, batch_tokens, model.flops_per_token(objective.seq_len))
        bar = tqdm(total=steps, initial=start, disable=not (rt.master and t.progress), unit="step",
                   dynamic_ncols=True, file=sys.stdout)
        say = lambda step, msg: rt.master and bar.write(f"step {step:6d} | {msg}")  # noqa: E731
        profiler = Profiler(t, out_dir, rt) if t.profile_steps else None
        guard = NonFiniteGuard(t.nonfinite, rt, model, objective, saver, say, start, logger.run_id, out_dir)
        result, paused, done = {}, False, start

        for step in range(start, steps):
            if profiler is not None:
                profiler.step(step - start)
            lr = scheduler.get_last_lr()[0]
            loss, grad_norm, stepped = train_step(
                train_model, objective.micro_batches(step), plan["grad_accum"], optimizer, scheduler, rt.autocast,
                cfg.optim.grad_clip, rt.no_sync, guard=lambda loss, norm: guard(step, loss, norm))
            meter.add(loss if stepped else None)
            done = step + 1
            bar.update(1)
            last = done == steps
            if done % t.log_interval == 0 or last:
                row = {**meter.row(done, lr, grad_norm), "nonfinite_skipped": saver.nonfinite_skipped}
                logger.log(row)
                bar.set_postfix(loss=f"{row['loss']:.3f}")
                say(done, meter.line(row))
                result.update(row)
            if done % t.eval_interval == 0 or last:
                metrics, row, line = objective.evaluate(model)
                logger.log({"step": done, **row})
                say(done, line)
                result.update(metrics)
                meter.restart()  # evaluation time is not training throughput
                if not last and (acc := objective.should_stop(metrics)) is not None:
                    say(done, f"accuracy {acc:.4f} >= train.stop_acc={t.stop_acc}: stopping")
                    saver.save(done, stopped_at_acc=acc, wandb_id=logger.run_id)
                    break
            if done % t.ckpt_interval == 0 or last:
                saver.save(done, wandb_id=logger.run_id)
                meter.restart()
            if why := stop.pause(rt, t, done, last):  # a stop signal or train.time_limit (trainer/preempt.py)
                if done % t.ckpt_interval:
                    saver.save(done, wandb_id=logger.run_id)  # a pause, not an end: resume=auto goes on from here
                paused = True
                say(done, f"{why}: checkpointed; run again (resume=auto) to go on")
                break
        bar.close()
        if profiler is not None:
            profiler.close()
        if done > start and not paused:
            result.update(step=done, tokens=done * batch_tokens)
            objective.finish(model, result, cfg, out_dir, run_cfg)
        logger.close()
        del train_model  # the DDP wrapper goes before the process group (Runtime.close says why)
        rt.close()
        return result
    finally:
        if lock is not None:
            lock.release()
        stop.close()


def main():
    cli(run, "config")


if __name__ == "__main__":
    main()
