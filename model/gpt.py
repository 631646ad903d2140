"""The GPT trunk that every backbone and positional scheme plugs into.

    x_0 = E[tokens] (+ absolute positional embedding) (-> dropout) (-> Norm if embed_norm, seed 003's extra norm)
    x_l = x_{l-1} + Mixer_l(Norm(x_{l-1}))           token mixer: model/mixers/
    x_l = x_l     + SwiGLU_l(Norm(x_l))              SwiGLU(x) = (silu(x W_1) * x W_3) W_2 (none if mlp_hidden=0)
    logits = Norm(x_L) W_head                         (W_head = E if tie_embeddings)

Norm is RMSNorm (norm=rms) or LayerNorm (norm=layer, Zoology's). Mixer_l is the backbone in every layer, or, with
layer_mixers, the pattern's entry l (cycled): "backbone" (with the positional scheme) or another backbone's name
(its default options, no scheme), e.g. Zoology's MQAR models [base_conv, backbone].

head=compress (MAD's compression task, an auto-encoder): every position t is decoded from the last state alone,
    logits_t = RMSNorm(D(x_L[T-1] + PE_sin(t))) W_head,   D = (RMSNorm, Linear, GELU) twice

Activation checkpointing (set_activation_checkpointing, train.activation_checkpointing), per block in training:
    full       keep each block's input x_{l-1}; backward runs the block's forward again
    selective  keep the outputs of matmuls and attention (the costly ops); recompute norms, activations, gates and
               element-wise ops (torchtitan's op-level policy). Triton / FLA kernels are not aten ops the policy can
               keep: their forward runs again too
Both give the gradients of the plain model (tests/test_memory.py).

Compilation (train.compile, train.compile_scope; compile_model): the model compiled whole, or each block and the
head on their own (scope blocks, torchtitan's regional compilation). The blocks run the same code with their
parameters as graph inputs, so one compilation serves all n_layer of them where the whole model is traced unrolled;
what is lost are fusions across a block's boundary.

Init (GPT-2 style): every Linear and Embedding ~ N(0, 0.02); projections that write into the residual stream
(mixer outputs, SwiGLU W_2) ~ N(0, 0.02 / sqrt(2 n_layer)) so the residual variance does not grow with depth;
a module with special parameters (gate biases, ...) sets them in its own `init_extra()`, called afterwards.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from duality.kernels.linear_ce import linear_cross_entropy
from duality.kernels.varlen import per_document
from torch import nn
from torch.utils.checkpoint import CheckpointPolicy, checkpoint, create_selective_checkpoint_contexts

from .core.context import TRAINING, Context, LayerState
from .core.layers import ShortConv, quack_available, quack_swiglu, residual_linear, swiglu_linear
from .pe.sinusoidal import sinusoid_table


def varying_shapes():
    """A context for inference whose shapes change call after call (scoring batches of other lengths, decoding with
    a growing KV cache): torch's SDPA without the cuDNN backend, which builds (~50 ms) and caches an execution plan
    per new shape. Training, at one shape, keeps cuDNN (trainer.runtime.training_backends)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    return sdpa_kernel([SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH])


@dataclass
class ModelConfig:
    vocab_size: int
    n_layer: int = 4
    d_model: int = 256
    n_heads: int = 4
    mlp_hidden: int | None = None  # None: 8/3 d_model rounded up to a multiple of 64; 0: no MLP (Zoology's MQAR)
    seq_len: int = 256  # the training context (max positions of a learned embedding)
    tie_embeddings: bool = False
    embed_norm: bool = False
    norm_eps: float = 1e-6
    init_std: float = 0.02
    # short convolutions' weights: None keeps their unit-gain init (N(0, 1/K)); a number draws them N(0, std) as
    # Hugging Face's init of a Conv1d does in FLA's models and seed 004's code (std 0.02)
    conv_init_std: float | None = None
    head: str = "lm"  # lm | compress
    norm: str = "rms"  # rms | layer
    embed_dropout: float = 0.0  # dropout on x_0 while training (Zoology's 0.1)
    layer_mixers: list[str] | None = None  # per layer, cycled: "backbone" or a backbone name (see above)
    # the SwiGLU's kernels: inductor (PyTorch, fused by torch.compile) | quack (quack-kernels' GEMMs with the SwiGLU
    # in their epilogues, training on CUDA; SwiGLU says where the PyTorch form runs instead)
    mlp_impl: str = "inductor"
    # loss by chunks of tokens, never holding the [B, T, V] logits (kernels/linear_ce/): 20% less peak memory for
    # the 124m model at 32 x 1024 tokens, 3% slower under torch.compile on an H100 (docs/throughput)
    fused_loss: bool = False
    # how each chunk's loss and logit gradient are formed: auto (the Triton kernel on CUDA, else chunked) | triton
    # (kernels/linear_ce/kernel.py: the logits read twice, written once, in bf16) | chunked (PyTorch; under compile,
    # Inductor's fusion, which made fp32 copies of the chunk)
    fused_loss_impl: str = "auto"
    # with fused_loss, the loss only over the positions that have a target (not -1): the same loss and gradients,
    # without the head's matmuls and logits at the rest (MQAR scores 1 position in 16: 1/16 of the head's work and
    # of the loss's logit chunk). Costs one host sync a step (the count of scored positions), so it applies eager
    # only (compiled, all positions are computed as before)
    sparse_loss: bool = False

    def __post_init__(self):
        if self.mlp_hidden is None:
            self.mlp_hidden = 64 * math.ceil(8 * self.d_model / 3 / 64)


NORMS = {"rms": nn.RMSNorm, "layer": nn.LayerNorm}
AC_MODES = ("none", "full", "selective")
# torch.compile's modes (train.compile_mode); "default" passes none
COMPILE_MODES = ("default", "max-autotune-no-cudagraphs", "max-autotune", "reduce-overhead")
COMPILE_SCOPES = ("model", "blocks")  # train.compile_scope


def compile_fn(fn, mode: str = "default"):
    """torch.compile(fn) in one of COMPILE_MODES."""
    if mode not in COMPILE_MODES:
        raise ValueError(f"compile mode {mode!r}; valid choices: {list(COMPILE_MODES)}")
    return torch.compile(fn, mode=None if mode == "default" else mode)


def compile_model(model: nn.Module, mode: str = "default", scope: str = "blocks"):
    """What the training loop calls: `model` compiled whole (scope model), or `model` itself with its blocks and
    head compiled on their own (scope blocks, GPT.compile_blocks; a model without blocks is compiled whole)."""
    if scope not in COMPILE_SCOPES:
        raise ValueError(f"compile scope {scope!r}; valid choices: {list(COMPILE_SCOPES)}")
    if scope == "blocks" and hasattr(model, "compile_blocks"):
        model.compile_blocks(mode)
        return model
    return compile_fn(model, mode)

# what selective checkpointing keeps: matmuls and attention, whose recompute would cost as much as the forward
_aten = torch.ops.aten
SAVED_OPS = {_aten.mm.default, _aten.addmm.default, _aten.bmm.default, _aten.baddbmm.default,
             _aten._scaled_dot_product_flash_attention.default, _aten._scaled_dot_product_efficient_attention.default,
             _aten._scaled_dot_product_cudnn_attention.default}


def _selective_policy(ctx, op, *args, **kwargs):
    return CheckpointPolicy.MUST_SAVE if op in SAVED_OPS else CheckpointPolicy.PREFER_RECOMPUTE


def _selective_contexts():
    return create_selective_checkpoint_contexts(_selective_policy)


def make_norm(cfg: ModelConfig) -> nn.Module:
    return NORMS[cfg.norm](cfg.d_model, eps=cfg.norm_eps)


class SwiGLU(nn.Module):
    """impl (model.mlp_impl): inductor, the PyTorch form (swiglu_linear) that torch.compile fuses; quack, quack-kernels'
    GEMMs with the SwiGLU in their epilogues (core/layers.py: quack_swiglu), for training steps on CUDA where the
    package is installed: inference (shapes that change call by call, each one autotuned anew) and other devices
    take the PyTorch form, the same function."""

    def __init__(self, d_model: int, hidden: int, impl: str = "inductor"):
        super().__init__()
        self.w13 = nn.Linear(d_model, 2 * hidden, bias=False)
        self.w2 = residual_linear(hidden, d_model)
        self.quack = impl == "quack" and torch.cuda.is_available() and quack_available()

    def forward(self, x):
        if self.quack and x.is_cuda and torch.is_grad_enabled():
            if torch.is_autocast_enabled("cuda"):
                # cast here, where a compiled block writes the norm's output in bf16 in the norm's kernel, not the
                # fp32 output quack would cast (and its gradient back) eagerly, outside the graph; the same values
                x = x.to(torch.get_autocast_dtype("cuda"))
            return quack_swiglu(x, self.w13.weight, self.w2.weight)
        a, b = self.w13(x).chunk(2, dim=-1)
        return swiglu_linear(a, b, self.w2.weight)


class Block(nn.Module):
    checkpointing = "none"  # AC_MODES; GPT.set_activation_checkpointing sets it
    compiled_forward = None  # full checkpointing of a compiled model: this block's own compiled _forward
    compiled_step = None  # compile scope blocks: the compiled _step (GPT.compile_blocks)

    def __init__(self, mixer: nn.Module, cfg: ModelConfig):
        super().__init__()
        self.norm1 = make_norm(cfg)
        self.mixer = mixer
        self.norm2 = make_norm(cfg)
        self.mlp = SwiGLU(cfg.d_model, cfg.mlp_hidden, cfg.mlp_impl) if cfg.mlp_hidden else None

    def forward(self, x, ctx: Context = TRAINING):
        if self.checkpointing == "full" and torch.is_grad_enabled():
            return self._full_checkpoint(x, ctx)
        # decoding (a state) stays eager under compile scope blocks: each step would be a new shape and state
        return (self.compiled_step if self.compiled_step is not None and ctx.state is None else self._step)(x, ctx)

    def _step(self, x, ctx: Context):
        if self.checkpointing == "selective" and torch.is_grad_enabled():
            # non-reentrant: works under torch.compile, DDP and FSDP2, and with inputs that need no gradient;
            # traced by Dynamo, which applies the policy in the compiled graph
            return checkpoint(self._forward, x, ctx, use_reentrant=False, context_fn=_selective_contexts)
        return self._forward(x, ctx)

    @torch.compiler.disable
    def _full_checkpoint(self, x, ctx):
        # Outside Dynamo, around this block's own compiled forward: Dynamo cannot trace a checkpoint whose region
        # breaks its graph (FLA's and this repo's Triton kernels do), and would run such a block eagerly (GLA at
        # 370m/4096: 407 ms a step instead of 297). The recompute then runs the compiled block again.
        return checkpoint(self.compiled_forward or self._forward, x, ctx, use_reentrant=False)

    def _forward(self, x, ctx: Context):
        h = self.norm1(x)
        if ctx.cu_seqlens is None or self.mixer.packed:  # packed: its kernels take the document boundaries
            h = self.mixer(h, ctx)
        else:
            h = per_document(self.mixer, ctx.cu_seqlens, h)
        x = x + h
        return x + self.mlp(self.norm2(x)) if self.mlp is not None else x


@dataclass
class Cache:
    """Generation state: the number of tokens seen (the position of the next one), and each layer's LayerState."""
    n_layer: int
    offset: int = 0
    layers: list[LayerState] = field(default_factory=list)

    def __post_init__(self):
        self.layers = [LayerState() for _ in range(self.n_layer)]


def with_forms(packed: bool = False) -> str:
    """The backbones and schemes (their config names) with a context-parallel form, over packed documents too when
    `packed`, read off their registries."""
    from .mixers import REGISTRY as MIXERS
    from .pe import REGISTRY as SCHEMES

    def names(registry):
        return ", ".join(sorted(n for n, c in registry.items() if c.context_parallel and (c.packable or not packed)))
    return f"backbone={{{names(MIXERS)}}} with pe={{{names(SCHEMES)}}}, where the pair is valid"


class GPT(nn.Module):
    compiled_head = None  # compile scope blocks: the compiled _head

    def __init__(self, cfg: ModelConfig, mixers: list[nn.Module], abs_pe: nn.Module | None = None):
        super().__init__()
        self.cfg = cfg
        self.wte = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.abs_pe = abs_pe
        self.embed_norm = make_norm(cfg) if cfg.embed_norm else nn.Identity()
        self.blocks = nn.ModuleList(Block(m, cfg) for m in mixers)
        self.norm = make_norm(cfg)
        self.lm_head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
        self.decoder = None
        if cfg.head == "compress":
            d = cfg.d_model
            self.decoder = nn.Sequential(nn.RMSNorm(d, eps=cfg.norm_eps), nn.Linear(d, d), nn.GELU(),
                                         nn.RMSNorm(d, eps=cfg.norm_eps), nn.Linear(d, d), nn.GELU())
        if cfg.tie_embeddings:
            self.lm_head.weight = self.wte.weight
        self.reset_parameters()

    def set_activation_checkpointing(self, mode: str, compile_blocks: bool = False,
                                     compile_mode: str = "default") -> None:
        """none | full | selective (the module docstring says what each keeps); before torch.compile or FSDP.
        compile_blocks (full, for a model that will be compiled): each block's forward is compiled on its own, and
        the checkpoint around it stays outside the model's compiled graph (Block._full_checkpoint says why)."""
        if mode not in AC_MODES:
            raise ValueError(f"activation checkpointing {mode!r}; valid choices: {list(AC_MODES)}")
        for block in self.blocks:
            block.checkpointing = mode
            full = compile_blocks and mode == "full"
            block.compiled_forward = compile_fn(block._forward, compile_mode) if full else None

    def compile_blocks(self, mode: str = "default") -> None:
        """Compile scope blocks: each block's step and the head (final norm, logits, loss) compiled on their own, the
        embedding and the loop over blocks eager. One compilation serves every block (the same code object; the
        parameters are graph inputs, torch.compile's inlined nn.Modules), so compiling costs about one block's
        tracing instead of n_layer blocks'."""
        for block in self.blocks:
            block.compiled_step = compile_fn(block._step, mode)
        self.compiled_head = compile_fn(self._head, mode)

    def reset_parameters(self):
        std, resid_std = self.cfg.init_std, self.cfg.init_std / math.sqrt(2 * self.cfg.n_layer)
        for m in self.modules():
            if isinstance(m, (nn.Linear, nn.Embedding)):
                nn.init.normal_(m.weight, 0.0, resid_std if getattr(m, "is_residual", False) else std)
                if getattr(m, "bias", None) is not None:
                    nn.init.zeros_(m.bias)
            elif isinstance(m, ShortConv) and self.cfg.conv_init_std is not None:
                nn.init.normal_(m.weight, 0.0, self.cfg.conv_init_std)
        for m in self.modules():
            if hasattr(m, "init_extra"):
                m.init_extra()

    def forward(self, idx, targets=None, cache: Cache | None = None, cu_seqlens=None, cp_group=None):
        """idx [B, T] -> (logits [B, T, V], loss or None). Targets of -1 are ignored by the loss. With fused_loss the
        loss comes without logits (None). cu_seqlens [N + 1]: idx [1, T] packs N documents (boundaries at
        cu_seqlens), and no token sees another document's (data/shards.py, pack_documents). cp_group: idx is this
        rank's slice of longer sequences split in equal slices over the group's ranks, in rank order (context
        parallelism; the recurrences hand their state over, kernels/recurrences/cp.py); with cu_seqlens, the slice's
        boundaries in its own coordinates, the first <= 0 where its first document began on a slice before
        (kernels/varlen.py: slice_boundaries)."""
        x = self.trunk(idx, cache, cu_seqlens, cp_group)
        return (self.compiled_head if self.compiled_head is not None and cache is None else self._head)(x, targets)

    def trunk(self, idx, cache: Cache | None = None, cu_seqlens=None, cp_group=None):
        """idx [B, T] -> the last block's output [B, T, d_model], before the head's norm (forward's arguments)."""
        x = self.wte(idx)
        offset = 0 if cache is None else cache.offset
        if cp_group is not None:
            import torch.distributed as dist
            self.check_context_parallel(packed=cu_seqlens is not None)
            offset = dist.get_rank(cp_group) * idx.shape[1]
        if self.abs_pe is not None:  # packed documents: positions restart at each
            x = self.abs_pe.embed(x, Context(offset, cu_seqlens))
        if self.cfg.embed_dropout:
            x = F.dropout(x, self.cfg.embed_dropout, self.training)
        x = self.embed_norm(x)
        for i, block in enumerate(self.blocks):
            x = block(x, Context(offset, cu_seqlens, None if cache is None else cache.layers[i], cp_group))
        if cache is not None:
            cache.offset += idx.shape[1]
        return x

    def _head(self, x, targets):
        if self.decoder is not None:
            pos = sinusoid_table(torch.arange(x.shape[1], device=x.device), x.shape[-1]).to(x.dtype)
            x = self.decoder(x[:, -1:] + pos)
        h = self.norm(x)
        if targets is not None and self.cfg.fused_loss:  # the loss without the [B, T, V] logits: kernels/linear_ce/
            h, targets = h.flatten(0, 1), targets.reshape(-1)
            if self.cfg.sparse_loss and not torch.compiler.is_compiling():
                scored = (targets != -1).nonzero().squeeze(1)  # backward of h[scored] gives the rest zero gradient
                h, targets = h[scored], targets[scored]
            return None, linear_cross_entropy(h, self.lm_head.weight, targets, -1, self.cfg.fused_loss_impl)
        logits = self.lm_head(h)
        loss = None
        if targets is not None:
            loss = F.cross_entropy(logits.float().view(-1, logits.shape[-1]), targets.reshape(-1), ignore_index=-1)
        return logits, loss

    def check_context_parallel(self, packed: bool = False) -> None:
        """Every mixer and scheme of this model has a context-parallel form (packed: one over packed documents), or a
        ValueError names those without."""
        parts = [b.mixer for b in self.blocks] + [b.mixer.pe for b in self.blocks if b.mixer.pe is not None]
        missing = sorted({type(m).__name__ for m in parts + ([self.abs_pe] if self.abs_pe is not None else [])
                          if not m.context_parallel} | ({"head=compress"} if self.decoder is not None else set()))
        if missing:
            raise ValueError(f"no context-parallel form yet for {missing}; those with one: {with_forms()}")
        # a layer that runs packed rows one document at a time has no slice of a document to hand over
        unpacked = sorted({f"{type(b.mixer).__name__}" + (f" + {type(b.mixer.pe).__name__}" if b.mixer.pe else "")
                           for b in self.blocks if not b.mixer.packed})
        if packed and unpacked:
            raise ValueError(f"no context-parallel form over packed documents yet for {unpacked}; those with one: "
                             f"{with_forms(packed=True)} (FoX without short convolutions)")

    @torch.no_grad()
    def generate(self, idx, max_new_tokens: int, temperature: float = 1.0, top_k: int | None = None,
                 generator: torch.Generator | None = None, stop=None, top_p: float | None = None,
                 cuda_graphs: bool | None = None):
        """Prefill the prompt in one parallel call, then decode one token per call into fixed buffers, each step
        replayed from a CUDA graph on a GPU (model/decode.py). temperature = 0 is greedy decoding;
        `stop(new_tokens [B, n]) -> bool` ends decoding early."""
        from .decode import generate
        P = idx.shape[1]
        return generate(self, idx, max_new_tokens, temperature, top_k, top_p, generator,
                        stop=None if stop is None else lambda ids, logits: bool(stop(ids[:, P:])),
                        cuda_graphs=cuda_graphs)

    def num_params(self, exclude_embeddings: bool = False) -> int:
        n = sum(p.numel() for p in self.parameters())
        if exclude_embeddings:
            n -= self.wte.weight.numel()
            if self.abs_pe is not None:
                n -= sum(p.numel() for p in self.abs_pe.parameters())
        return n

    def flops_per_token(self, seq_len: int) -> float:
        """Training FLOPs per token: 6 x (matmul parameters, LM head included) + 3 x each mixer's own forward FLOPs
        (attention scores, recurrences), so MFU is right for non-softmax backbones too."""
        matmul_params = self.num_params(exclude_embeddings=True)
        if self.cfg.tie_embeddings:  # the tied head is still a matmul
            matmul_params += self.lm_head.weight.numel()
        return 6.0 * matmul_params + 3.0 * sum(b.mixer.flops_per_token(seq_len) for b in self.blocks)
