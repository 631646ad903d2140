"""Decoding: the prompt through the parallel (chunked) kernels, then one token a step into preallocated state, each
step replayed from one CUDA graph.

    prefill    GPT.forward(prompt, cache=Cache): every layer's state as the incremental form leaves it (a linear
               recurrence's S, the short convolutions' last inputs, a running angle; softmax attention's keys and
               values, a forget gate's running sum)
    fix        that state moved into buffers of fixed shape: the KV caches (k, v, c) become [B, max_len, ...] buffers
               written at the position of each new token, the position itself a 0-d tensor (Context.static); the
               fixed-size state is written back in place after each step
    step       one token through the trunk: the recurrences by FLA's fused recurrent kernels (one launch a layer),
               softmax attention over the whole buffer with the keys past the token masked (cached_attention)

On a GPU the step is captured once in a CUDA graph and replayed: a step of a 370m model is some 500 small kernels,
whose launches from Python cost 20-50 ms where the GPU needs about 1 (issue #73's profile). Nothing in a step may
then read a value back to the host or change shape, which is why the position is a tensor and the caches are
buffers. A step with a changing shape is kept where a scheme needs one: T5's and Transformer-XL's biases are built
for a growing cache (`refusal` names them); those models decode eagerly through the same loop.

compile=True (generate's, and DualityForCausalLM.generate's compile_step=True) runs the step through torch.compile
before the capture: inductor fuses each layer's element-wise work, the launches a replay still pays for (a 370m GLA:
1.82 -> 1.29 ms a token on an H200, docs/inference.md); a compilation per batch size and buffer length.

`generate` is the loop: sampling on the GPU (greedy, temperature, top-k, top-p), end-of-sequence rows padded and
the loop stopped once every row has ended, as transformers' generate does (hf.py routes its generate here when the
request needs nothing else; tests/test_decode.py checks the two give the same tokens).
"""

from __future__ import annotations

from contextlib import nullcontext

import torch

from .gpt import GPT, Cache, varying_shapes

PREFILL_TOKENS = 1 << 17  # tokens (batch x chunk) a prefill forward takes at once
FIXED_FIELDS = ("S", "conv", "phi", "u")  # LayerState's fields of fixed size, written back after each step
CACHE_FIELDS = ("k", "v", "c")  # those that grow by a token a step: buffers of max_len positions


def refusal(model: GPT) -> str | None:
    """Why `model` cannot decode into fixed buffers (None: it can)."""
    for block in model.blocks:
        pe = block.mixer.pe
        if pe is not None and pe.score_bias:
            return f"pe={pe.name}'s bias b_ij is built for the keys of a growing cache"
    return None


def _copy_into(buffer, new):
    """Write `new` (a step's value of a fixed-size field: a tensor, a tuple of them, or a dict of them) into
    `buffer` of the same structure; return `buffer`."""
    if isinstance(buffer, torch.Tensor):
        if new is not buffer:
            buffer.copy_(new)
    elif isinstance(buffer, dict):
        for key, b in buffer.items():
            _copy_into(b, new[key])
            new[key] = b  # the same dict object the mixer writes into
        return new
    else:
        for b, n in zip(buffer, new):
            _copy_into(b, n)
    return buffer


def _own(value):
    """A copy of a field's tensors in memory of their own (a prefill's state may be a view of a larger output)."""
    if isinstance(value, torch.Tensor):
        return value.clone()
    if isinstance(value, dict):
        return {k: _own(v) for k, v in value.items()}
    return type(value)(_own(v) for v in value)


class Decoder:
    """`model`'s decoding state for a batch of prompts of one length and up to `max_len` tokens in all.

    prefill(idx [B, P]) -> logits [B, V] at the last prompt token; step(tokens [B, 1]) -> logits [B, V] at that
    token. graphs: replay each step from a CUDA graph (None: on a CUDA device when the model decodes into fixed
    buffers). The logits returned by a graphed step are overwritten by the next step: use them before it."""

    def __init__(self, model: GPT, max_len: int, graphs: bool | None = None, fixed: bool | None = None,
                 compile: bool = False):
        why = refusal(model)
        if fixed and why:
            raise ValueError(f"this model cannot decode into fixed buffers: {why}")
        self.model, self.max_len = model, max_len
        self.fixed = why is None if fixed is None else fixed
        device = next(model.parameters()).device
        self.graphs = (device.type == "cuda" and self.fixed) if graphs is None else graphs
        if self.graphs and not (self.fixed and device.type == "cuda"):
            raise ValueError("CUDA graphs need a CUDA device and fixed decoding buffers "
                             f"({why or 'device ' + str(device)})")
        limit = model.abs_pe.max_positions if model.abs_pe is not None else None
        if limit is not None and max_len > limit:
            raise ValueError(f"pe={model.abs_pe.name} has {limit} positions; decoding to {max_len} tokens asks for "
                             "more. Learned embeddings cannot extrapolate: use a relative scheme for longer contexts")
        # compile: the step's forward through torch.compile (inductor fuses a layer's element-wise work: fewer kernels
        # in the graph, each of which costs a few µs of launch even when replayed), compiled in the warm-up step
        self.forward = torch.compile(model, dynamic=False) if compile else model
        self.cache = Cache(len(model.blocks))
        self.buffers: list[dict] = []
        self.graph = self.tokens = self.logits = None
        self.warm = 0  # eager steps taken before the capture

    def prefill(self, idx: torch.Tensor) -> torch.Tensor:
        """The prompt through the parallel kernels in chunks of at most PREFILL_TOKENS tokens over the batch, each
        continuing from the state the last left (the incremental form takes any T): a 32 x 32k prompt at once made
        [10^6, 5632] MLP activations (an illegal memory access on an H200, 2026-11-29) and OOMs."""
        B, P = idx.shape
        if P >= self.max_len:
            raise ValueError(f"a prompt of {P} tokens leaves no room in max_len={self.max_len}")
        chunk = max(1, PREFILL_TOKENS // B)
        with varying_shapes():  # the head at the last position only: [B, P, V] logits of a long prompt are GBs
            for s in range(0, P, chunk):
                x = self.model.trunk(idx[:, s:s + chunk], self.cache)
            logits, _ = self.model._head(x[:, -1:], None)
        if self.fixed:
            self._fix(idx.shape[1])
        return logits[:, -1]

    def _fix(self, P: int):
        """The prefill's state into buffers: KV caches padded to max_len positions, the rest copied."""
        for state in self.cache.layers:
            for name in CACHE_FIELDS:
                t = getattr(state, name)
                if t is not None:  # (the prefill's cache is freed as its buffer replaces it, layer by layer)
                    buf = t.new_zeros(t.shape[0], self.max_len, *t.shape[2:])
                    buf[:, :P] = t
                    setattr(state, name, buf)
                    del t
            own = {name: _own(getattr(state, name)) for name in FIXED_FIELDS
                   if getattr(state, name) is not None and not (name == "conv" and not state.conv)}
            for name, value in own.items():
                setattr(state, name, value if name != "conv" else dict(value))
            self.buffers.append(own)
        device = next(self.model.parameters()).device
        self.cache.offset = torch.tensor(P, device=device)

    def _run(self, tokens):
        with varying_shapes():  # (no cuDNN attention: it builds a plan per shape, on the host)
            logits, _ = self.forward(tokens, cache=self.cache)
        for state, own in zip(self.cache.layers, self.buffers):
            for name, buf in own.items():
                setattr(state, name, _copy_into(buf, getattr(state, name)))
        return logits[:, -1]

    def step(self, tokens: torch.Tensor) -> torch.Tensor:
        if not self.fixed:
            with varying_shapes():
                return self.model(tokens, cache=self.cache)[0][:, -1]
        if not self.graphs:
            return self._run(tokens)
        if self.tokens is None:  # the graph's input; every step reads it, so a compiled step sees one layout
            self.tokens = torch.empty_like(tokens, memory_format=torch.contiguous_format)
        self.tokens.copy_(tokens)
        # the first steps eagerly, on a side stream: kernels compiled and autotuned before capture (a compiled step
        # twice: a recompilation, e.g. for a guard the first step's inputs did not meet, must not happen in capture)
        if self.warm < (2 if self.forward is not self.model else 1):
            self.warm += 1
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                out = self._run(self.tokens)
            torch.cuda.current_stream().wait_stream(side)
            return out
        if self.graph is None:
            self.graph = torch.cuda.CUDAGraph()
            try:
                with torch.cuda.graph(self.graph):
                    self.logits = self._run(self.tokens)
            except RuntimeError as e:
                raise RuntimeError(f"a CUDA graph could not capture this model's decoding step ({e}); decode "
                                   "eagerly: generate(..., cuda_graphs=False)") from e
        self.graph.replay()
        return self.logits


def sample(logits: torch.Tensor, temperature: float = 0.0, top_k: int | None = None, top_p: float | None = None,
           generator: torch.Generator | None = None) -> torch.Tensor:
    """The next token [B, 1] from logits [B, V]: argmax at temperature 0, else a draw from softmax(logits / T)
    restricted to the top_k most likely tokens and then to the smallest set whose probability reaches top_p
    (transformers' warpers, in their order), all on the logits' device."""
    logits = logits.float()
    if not temperature:
        return logits.argmax(-1, keepdim=True)
    logits = logits / temperature
    if top_k:
        kth = torch.topk(logits, min(top_k, logits.shape[-1])).values[:, -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p is not None and top_p < 1.0:
        ordered, order = logits.sort(-1, descending=True)
        probs = ordered.softmax(-1)
        drop = probs.cumsum(-1) - probs >= top_p  # the mass before a token already reaches top_p (keeps the first)
        logits = logits.scatter(-1, order, ordered.masked_fill(drop, float("-inf")))
    return torch.multinomial(logits.softmax(-1), 1, generator=generator)


@torch.no_grad()
def generate(model: GPT, idx: torch.Tensor, max_new_tokens: int, temperature: float = 0.0, top_k: int | None = None,
             top_p: float | None = None, generator: torch.Generator | None = None, eos_token_id=None,
             pad_token_id: int | None = None, stop=None, cuda_graphs: bool | None = None, compile: bool = False,
             precision=nullcontext) -> torch.Tensor:
    """idx [B, P] -> [B, P + n], n <= max_new_tokens new tokens (sample's arguments choose them).

    eos_token_id (an id or a list): a row that emits one is finished; its later tokens are pad_token_id, and
    decoding stops once every row is finished. stop(ids [B, P + t], logits [B, V]) -> bool or [B] bools, called
    after each token (transformers' stopping criteria; a host sync a step): rows it returns True for are finished.
    Without `stop`, whether every row is finished is read back every 8 steps only, and the output cut where they
    all were. precision: a context manager factory the forward runs under (autocast). compile: the step through
    torch.compile (Decoder)."""
    if model.decoder is not None:
        raise ValueError("model.head=compress decodes a whole sequence from one state; it does not generate")
    if max_new_tokens < 0:
        raise ValueError(f"max_new_tokens={max_new_tokens} must be >= 0")
    B, P = idx.shape
    if max_new_tokens == 0:
        return idx
    eos = None if eos_token_id is None else torch.tensor(
        [eos_token_id] if isinstance(eos_token_id, int) else list(eos_token_id), device=idx.device)
    pad = pad_token_id if pad_token_id is not None else (None if eos is None else int(eos[0]))
    decoder = Decoder(model, P + max_new_tokens, graphs=cuda_graphs, compile=compile)
    with precision():
        logits = decoder.prefill(idx)
    new, live, all_done = [], torch.ones(B, dtype=torch.bool, device=idx.device), []
    for i in range(max_new_tokens):
        token = sample(logits, temperature, top_k, top_p, generator)
        if eos is not None:  # as transformers: finished rows are padded when an end-of-sequence id is given
            token = torch.where(live[:, None], token, pad)
        new.append(token)
        if eos is not None:
            live = live & ~torch.isin(token[:, 0], eos)
        if stop is not None:
            done = stop(torch.cat([idx, *new], 1), logits.float())
            live = live & ~torch.as_tensor(done, device=idx.device).bool().expand(B)
            if not bool(live.any()):
                break
        elif eos is not None:
            all_done.append(~live.any())
            if i % 8 == 7 and not bool(live.any()):
                break
        if i + 1 < max_new_tokens:
            with precision():
                logits = decoder.step(token)
    out = torch.cat([idx, *new], 1)
    if all_done:  # cut after the first step at which every row had finished
        done = torch.stack(all_done)
        if bool(done.any()):
            out = out[:, :P + int(done.int().argmax()) + 1]
    return out
