"""Where a run executes: rank, world size, device and autocast, DDP / FSDP2 wrapping, and the model and optimizer
state gathered whatever the strategy (so a checkpoint loads under any strategy and world size)."""

from __future__ import annotations

import os
import re
import time
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from duality.common.errors import ConfigError

from duality.model.gpt import compile_model


def training_backends():
    """The context train_step runs in: torch's SDPA tries cuDNN first. On an H100 its causal attention is 1.6x faster
    than FlashAttention-2 (docs/attention/bench_attention.md) but torch ranks it after flash, efficient and math.
    (Inference, whose shapes change call after call, uses model.gpt.varying_shapes instead.)"""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    return sdpa_kernel([SDPBackend.CUDNN_ATTENTION, SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION,
                        SDPBackend.MATH], set_priority=True)


@dataclass
class Runtime:
    rank: int = 0
    world: int = 1
    local_rank: int = 0
    cp: int = 1  # train.context_parallel: ranks that split each sequence (consecutive ranks, one group)
    cp_group: object = None
    on_close: list = field(default_factory=list)  # called by close() first (an asynchronous checkpoint's publication)
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))
    distributed: bool = False
    fsdp: bool = False
    fsdp_reshard: object = "auto"  # train.fsdp_reshard; prepare() resolves auto
    fsdp_param_dtype: str = "float32"  # train.fsdp_param_dtype
    fsdp_prefetch: int = 1  # train.fsdp_prefetch: blocks whose all-gather a block issues ahead (0: FSDP2's own order)
    float8: str = "none"  # train.float8: torchao's recipe for the trunk's Linear layers
    bf16: bool = False
    bf16_weights: bool = False  # train.dtype=bf16_weights: the model itself in bf16 (shard casts it)
    no_sync: object = None  # the wrapper's "skip the gradient all-reduce" context, set by wrap()
    started: float = field(default_factory=time.perf_counter)

    @classmethod
    def start(cls, cfg) -> "Runtime":
        """From torchrun's environment (RANK, WORLD_SIZE, LOCAL_RANK) and train.device / dtype / strategy; joins the
        process group."""
        t = cfg.train
        rt = cls()
        rt.distributed = cls.world_size() > 1
        if rt.distributed:
            rt.rank, rt.world, rt.local_rank = (int(os.environ[k]) for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK"))
        rt.fsdp = rt.distributed and t.get("strategy", "ddp") == "fsdp"
        rt.fsdp_reshard = t.get("fsdp_reshard", "auto")
        rt.fsdp_param_dtype = t.get("fsdp_param_dtype", "float32")
        rt.fsdp_prefetch = t.get("fsdp_prefetch", 1)
        cuda = t.device == "cuda" or (t.device == "auto" and torch.cuda.is_available())
        rt.device = torch.device(f"cuda:{rt.local_rank}" if cuda else "cpu")
        rt.bf16 = t.dtype in ("bf16", "bf16_weights") or (t.dtype == "auto" and cuda)
        rt.bf16_weights = t.dtype == "bf16_weights"
        rt.float8 = t.get("float8", "none")
        if rt.float8 != "none":
            capability = torch.cuda.get_device_capability(rt.device) if cuda else None
            if capability is None or capability < (8, 9):
                raise ConfigError(f"train.float8={rt.float8} needs a GPU of compute capability >= 8.9 (Ada, Hopper); "
                                  f"this run's device is {torch.cuda.get_device_name(rt.device) if cuda else 'cpu'}")
            try:
                import torchao.float8  # noqa: F401
            except ImportError as e:
                raise ConfigError(f"train.float8={rt.float8} needs torchao ({e}): pip install torchao (or the "
                                  "repo's [float8] extra)") from None
        if rt.fsdp_param_dtype == "bfloat16" and (not rt.bf16 or rt.bf16_weights):
            raise ConfigError(f"train.fsdp_param_dtype=bfloat16 computes a bf16-autocast run's parameters in bf16; "
                              f"this run's train.dtype={t.dtype} is {'bf16_weights' if rt.bf16_weights else 'fp32'}")
        if rt.distributed:
            if cuda:
                torch.cuda.set_device(rt.device)
            # device_id binds NCCL to this rank's GPU (else every barrier warns that it guesses the device)
            dist.init_process_group(backend="nccl" if cuda else "gloo", device_id=rt.device if cuda else None)
            rt.cp = t.get("context_parallel", 1)
            for first in range(0, rt.world, rt.cp) if rt.cp > 1 else ():  # every rank makes every group
                group = dist.new_group(list(range(first, first + rt.cp)))
                if first <= rt.rank < first + rt.cp:
                    rt.cp_group = group
        return rt

    @property
    def data_rank(self) -> int:
        """This rank's place among the ranks that see different sequences (a context-parallel group shares one)."""
        return self.rank // self.cp

    @property
    def data_world(self) -> int:
        return self.world // self.cp

    @staticmethod
    def world_size() -> int:
        """The number of processes torchrun (or srun) started (1 without either), before any process group exists."""
        from_slurm()
        return int(os.environ.get("WORLD_SIZE", "1")) if "RANK" in os.environ else 1

    @property
    def master(self) -> bool:
        return self.rank == 0

    @property
    def cuda(self) -> bool:
        return self.device.type == "cuda"

    @property
    def autocast(self):
        return torch.autocast(self.device.type, dtype=torch.bfloat16) if self.bf16 else nullcontext()

    def describe(self) -> str:
        split = f", sequences split over {self.cp}" if self.cp > 1 else ""
        return (f"world {self.world}{' (FSDP)' if self.fsdp else ' (DDP)' if self.distributed else ''}{split}; device "
                f"{self.device}, {'bf16 autocast' if self.bf16 else 'fp32'}")

    # -------------------------------------------------------------------------------------------- wrapping
    def prepare(self, model):
        """The model as this runtime trains it, in place, before the optimizer exists. train.dtype=bf16_weights: cast
        to bf16 (parameters, so gradients and AdamW state, and buffers). train.strategy=fsdp: FSDP2 shards each
        block, then the rest (embeddings, head), over all ranks; parameters become DTensors and are gathered one block
        at a time in forward and backward. train.fsdp_reshard=false keeps them gathered from the first forward of a
        step to the last backward: one all-gather a step instead of two a micro-batch (FSDP2 at 124m ran at 71% of
        DDP's speed, re-gathering for every micro-batch). train.fsdp_param_dtype=bfloat16 gathers them in bf16 (half
        the bytes of the all-gather that a profile found exposed, docs/multi_gpu) and reduces gradients in fp32; the
        sharded parameters and AdamW's state stay fp32. train.fsdp_prefetch=k: each block issues the all-gathers of
        the next k blocks (forward) or the previous k (backward) once its own is issued, so they run beside its
        compute; FSDP2's own order issues a block's all-gather when the CPU reaches it, which under torch.compile
        is too late to overlap (the exposed all-gathers of that profile)."""
        if self.cp > 1:
            try:
                model.check_context_parallel()
            except ValueError as e:
                raise ConfigError(f"train.context_parallel={self.cp}: {e}") from None
        if self.bf16_weights:
            model.to(torch.bfloat16)
        if self.float8 != "none":
            float8_linears(model, self.float8)
        if not self.fsdp:
            return model
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
        mesh = init_device_mesh(self.device.type, (self.world,))
        mp = (MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
              if self.fsdp_param_dtype == "bfloat16" else MixedPrecisionPolicy())
        if self.fsdp_reshard == "auto":  # keep them gathered where that costs little memory
            size = sum(p.numel() * p.element_size() for p in model.parameters())
            free = torch.cuda.get_device_properties(self.device).total_memory if self.cuda else 0
            self.fsdp_reshard = not size <= 0.05 * free
        for block in model.blocks:
            fully_shard(block, mesh=mesh, reshard_after_forward=self.fsdp_reshard, mp_policy=mp)
        fully_shard(model, mesh=mesh, reshard_after_forward=self.fsdp_reshard, mp_policy=mp)
        if k := self.fsdp_prefetch:
            blocks = list(model.blocks)
            model.set_modules_to_forward_prefetch(blocks[:k])  # the root (embeddings) runs first
            for i, block in enumerate(blocks):
                block.set_modules_to_forward_prefetch(blocks[i + 1:i + 1 + k])
                block.set_modules_to_backward_prefetch(blocks[max(i - k, 0):i][::-1])
        return model

    def wrap(self, model, compile: bool, mode: str = "default", scope: str = "blocks"):
        """The module the loop calls: compiled (torch.compile's `mode`, whole or block by block: compile_model) if
        asked, then DDP (FSDP has sharded the model in place)."""
        train_model = compile_model(model, mode, scope) if compile else model
        if self.fsdp:
            self.no_sync = lambda: _fsdp_no_sync(model, keep_gathered=not self.fsdp_reshard)
        elif self.distributed:
            from torch.nn.parallel import DistributedDataParallel as DDP
            # gradient_as_bucket_view: gradients live in the all-reduce buckets (no copy in, no second copy in
            # memory); no buffer broadcast before every forward: the buffers are constants (RoPE tables, slopes)
            train_model = DDP(train_model, device_ids=[self.local_rank] if self.cuda else None,
                              gradient_as_bucket_view=True, broadcast_buffers=False)
            self.no_sync = train_model.no_sync
        return train_model

    def close(self):
        """Write what this run autotuned ($DUALITY_TUNE_OUT) and leave the process group. The caller drops its DDP
        wrapper first: were DDP's reducer to drop the last reference to the gloo process group, the group's
        destructor would join gloo's worker threads while holding the GIL, and a worker that still frees the last
        collective's tensors needs the GIL (a deadlock seen on loaded CPU machines). no_sync is DDP's bound method:
        it holds the wrapper too."""
        self.no_sync = None
        for hook in self.on_close:  # e.g. an asynchronous checkpoint still being written: wait and publish it
            hook()
        if self.cuda:
            import duality.kernels.tuned_configs as tc
            tc.dump_requested(f"{os.getpid()}-rank{self.rank}")
        if self.distributed:
            dist.destroy_process_group()

    # ------------------------------------------------------------------------------------------ collectives
    def mean(self, x: torch.Tensor) -> torch.Tensor:
        """x averaged over ranks, in place."""
        if self.distributed:
            dist.all_reduce(x)
            x /= self.world
        return x

    def master_decides(self, flag: bool) -> bool:
        """Rank 0's answer for all (ranks that disagreed, e.g. on a clock, would wait on each other forever)."""
        t = torch.tensor(float(flag), device=self.device)
        if self.distributed:
            dist.broadcast(t, 0)
        return bool(t.item())

    def all_finite(self, tensors) -> bool:
        """Whether every tensor (the local shards under FSDP) is finite on every rank: one reduction, one sync."""
        local = [x.to_local() if hasattr(x, "to_local") else x for x in tensors]  # FSDP: DTensor shards
        flags = [torch.isfinite(x).all() for x in local if torch.is_tensor(x) and x.is_floating_point()]
        ok = torch.stack(flags).all().float() if flags else torch.ones(())
        if self.distributed:
            dist.all_reduce(ok, op=dist.ReduceOp.MIN)
        return bool(ok.item())

    def gather_objects(self, obj) -> list:
        if not self.distributed:
            return [obj]
        out = [None] * self.world
        dist.all_gather_object(out, obj)
        return out

    def barrier(self):
        if self.distributed:
            dist.barrier()

    # ------------------------------------------------------------------------------------------------ state
    def model_state(self, model) -> dict:
        """The whole model's state dict, whatever the strategy (FSDP: gathered to rank 0; a collective)."""
        if not self.fsdp:
            return model.state_dict()
        from torch.distributed.checkpoint.state_dict import get_model_state_dict
        return get_model_state_dict(model, options=_full_state_options())

    def optimizer_state(self, model, optimizer) -> dict:
        """Optimizer state keyed by parameter name (FSDP's full form), so a checkpoint loads under any strategy and
        world size. FSDP: gathered to rank 0 (a collective)."""
        if self.fsdp:
            from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict
            return get_optimizer_state_dict(model, optimizer, options=_full_state_options())
        sd = optimizer.state_dict()  # keyed by position over the param groups
        names = {id(p): n for n, p in model.named_parameters()}
        key = [names[id(p)] for g in optimizer.param_groups for p in g["params"]]
        return {"state": {key[i]: v for i, v in sd["state"].items()},
                "param_groups": [{**g, "params": [key[i] for i in g["params"]]} for g in sd["param_groups"]]}

    def sharded_state(self, model, optimizer) -> dict:
        """Model and optimizer state for torch.distributed.checkpoint, the optimizer keyed by parameter name: under
        FSDP each rank's own shards (nothing gathered), else the whole tensors, which DCP writes once."""
        if not self.fsdp:
            return {"model": model.state_dict(), "optimizer": self.optimizer_state(model, optimizer)}
        from torch.distributed.checkpoint.state_dict import get_state_dict
        model_sd, optim_sd = get_state_dict(model, optimizer)
        return {"model": model_sd, "optimizer": optim_sd}

    def load_optimizer_state(self, model, optimizer, sd: dict) -> None:
        if self.fsdp:
            from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict
            set_optimizer_state_dict(model, optimizer, sd, options=StateDictOptions(full_state_dict=True))
            return
        groups = sd["param_groups"]
        if groups and groups[0]["params"] and isinstance(groups[0]["params"][0], str):  # by name -> by position
            pos = {n: i for i, n in enumerate(n for g in groups for n in g["params"])}
            sd = {"state": {pos[n]: v for n, v in sd["state"].items()},
                  "param_groups": [{**g, "params": [pos[n] for n in g["params"]]} for g in groups]}
        optimizer.load_state_dict(sd)


def float8_linears(model, recipe: str):
    """torchao's float8 training (recipe: tensorwise or rowwise scaling) on every Linear of the trunk whose sizes are
    multiples of 16, as torchtitan converts them; not the head, whose weight the fused loss reads directly. The
    parameters keep their names, so checkpoints load into a model without float8."""
    from torchao.float8 import Float8LinearConfig, convert_to_float8_training
    convert_to_float8_training(model, config=Float8LinearConfig.from_recipe_name(recipe),
                               module_filter_fn=lambda m, fqn: fqn != "lm_head" and m.in_features % 16 == 0
                               and m.out_features % 16 == 0)


@contextmanager
def _fsdp_no_sync(model, keep_gathered: bool):
    """A micro-batch before the step's last: no gradient reduce-scatter, and (keep_gathered) no re-sharding of the
    parameters after its backward, so the next micro-batch finds them gathered."""
    model.set_requires_gradient_sync(False)
    if keep_gathered:
        model.set_reshard_after_backward(False)
    try:
        yield
    finally:
        model.set_requires_gradient_sync(True)
        model.set_reshard_after_backward(True)


def _full_state_options():
    from torch.distributed.checkpoint.state_dict import StateDictOptions
    return StateDictOptions(full_state_dict=True, cpu_offload=True)


def first_host(nodelist: str) -> str:
    """The first host of a Slurm node list: `gpu[07-09,12],cpu1` -> `gpu07`, `node1,node2` -> `node1`."""
    prefix, ranges = re.match(r"([^,\[]*)(?:\[([^\]]*)\])?", nodelist).groups()
    return prefix + (ranges.split(",")[0].split("-")[0] if ranges else "")


def from_slurm(env=os.environ) -> None:
    """`srun python train.py`: each task's rank, world and local rank from Slurm's variables into torchrun's, and the
    first node of the step as the rendezvous (MASTER_PORT, else 29500), as Lightning's and torchtitan's launchers do.
    Only for a step srun started (SLURM_STEP_NUM_TASKS), never under torchrun (RANK set) nor for a plain `python` in
    a batch script, whose allocation may hold more tasks than this one process."""
    if "RANK" in env or "SLURM_PROCID" not in env or int(env.get("SLURM_STEP_NUM_TASKS", "1")) < 2:
        return
    env.update(RANK=env["SLURM_PROCID"], WORLD_SIZE=env["SLURM_STEP_NUM_TASKS"],
               LOCAL_RANK=env.get("SLURM_LOCALID", "0"))
    env.setdefault("MASTER_ADDR", first_host(env.get("SLURM_STEP_NODELIST") or env.get("SLURM_NODELIST", "localhost")))
    env.setdefault("MASTER_PORT", "29500")
    if "OMP_NUM_THREADS" not in env:  # as torchrun does: the node's cores shared by its tasks, not each task all of
        # them (two tasks on 2 cores took 157 s for what one took 48 s, issue #76)
        local = int(re.match(r"\d+", env.get("SLURM_STEP_TASKS_PER_NODE") or env["SLURM_STEP_NUM_TASKS"]).group(0))
        threads = int(env.get("SLURM_CPUS_PER_TASK") or max(1, (os.cpu_count() or 1) // max(local, 1)))
        env["OMP_NUM_THREADS"] = str(threads)
        torch.set_num_threads(threads)
