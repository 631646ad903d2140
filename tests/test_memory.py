"""Long runs and big models: activation checkpointing gives the plain model's gradients (every backbone, eager and
through torch.compile's autograd); the non-finite guard catches a NaN before the optimizer step, names the step and
the module that went bad, and stops with the last good state or skips the step."""

import json
import re

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from conftest import compose, metrics_rows, tiny_overrides

from duality import train as train_lib
from duality.common.errors import ConfigError, NonFinite
from duality.model import build_model
from duality.model.gpt import AC_MODES, compile_model
from duality.model.mixers import REGISTRY as MIXERS
from duality.trainer.guard import first_nonfinite_output, nonfinite_gradients
from duality.trainer.objective import Objective

V, T = 53, 20
SIZE = {"name": "t", "n_layer": 3, "d_model": 32, "n_heads": 4, "seq_len": T}
PE = {"transformer": "rope", "fox": "nope", "sympow": "rope", "path": "nope", "path_fox": "nope"}


def _make(backbone, mode, **size):
    torch.manual_seed(0)
    m = build_model({"name": backbone}, {"name": PE.get(backbone, "nope")}, {**SIZE, **size}, V).double()
    with torch.no_grad():  # zero-initialised gate biases etc. would hide code paths
        for p in m.parameters():
            p.add_(0.05 * torch.randn_like(p))
    m.set_activation_checkpointing(mode)
    return m


def _grads(m, idx, run=None):
    """The loss and every parameter's gradient of m, called through `run` (m itself, or m compiled)."""
    m.zero_grad(set_to_none=True)
    _, loss = (m if run is None else run)(idx, idx.roll(-1, 1))
    loss.backward()
    return loss.detach(), {n: p.grad.clone() for n, p in m.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("backbone", sorted(MIXERS))
def test_activation_checkpointing_gives_the_plain_gradients(backbone):
    idx = torch.randint(0, V, (2, T))
    plain = _make(backbone, "none")
    loss, ref = _grads(plain, idx)
    assert len(ref) == sum(1 for _ in plain.parameters())  # every parameter got a gradient
    for mode in ("full", "selective"):
        got_loss, got = _grads(_make(backbone, mode), idx)
        assert got_loss == loss
        assert got.keys() == ref.keys()
        for n in ref:
            torch.testing.assert_close(got[n], ref[n], rtol=1e-12, atol=1e-12, msg=f"{mode}: {n}")


def test_what_each_mode_recomputes():
    """The aten ops run during backward, counted: full runs every block's forward again (its matmuls too), selective
    runs the norms and activations again but keeps the matmul outputs (the same matmuls as without checkpointing)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Count(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.ops = {}

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            name = func.overloadpacket.__name__
            self.ops[name] = self.ops.get(name, 0) + 1
            return func(*args, **(kwargs or {}))

    idx = torch.randint(0, V, (2, T))
    counts = {}
    for mode in AC_MODES:
        m = _make("transformer", mode, n_layer=4)
        _, loss = m(idx, idx.roll(-1, 1))
        with Count() as c:
            loss.backward()
        counts[mode] = c.ops
    mm = {mode: sum(n for op, n in ops.items() if op in ("mm", "addmm", "bmm")) for mode, ops in counts.items()}
    silu = {mode: ops.get("silu", 0) for mode, ops in counts.items()}
    assert mm["selective"] == mm["none"] < mm["full"], mm
    # one SwiGLU per block: its backward forms silu(a) again (swiglu_linear), and checkpointing runs its forward again
    assert silu["none"] == 4 and silu["full"] == silu["selective"] == 8, silu


@pytest.mark.slow
def test_activation_checkpointing_under_torch_compile():
    """selective: Dynamo traces the checkpointed blocks and AOTAutograd partitions them; full: each block compiled on
    its own, inside an eager checkpoint (the aot_eager backend: Inductor's code generation would only add compile time
    here). Gradients equal the eager plain model's."""
    idx = torch.randint(0, V, (2, T))
    loss, ref = _grads(_make("gla", "none"), idx)
    torch._dynamo.reset()
    for mode in ("full", "selective"):
        m = _make("gla", mode)
        if mode == "full":  # as train.py compiles it: each block on its own, inside the checkpoint
            m.set_activation_checkpointing(mode)
            for b in m.blocks:
                b.compiled_forward = torch.compile(b._forward, backend="aot_eager")
        got_loss, got = _grads(m, idx, torch.compile(m, backend="aot_eager"))
        torch.testing.assert_close(got_loss, loss, rtol=1e-12, atol=1e-12)
        for n in ref:
            torch.testing.assert_close(got[n], ref[n], rtol=1e-12, atol=1e-12, msg=f"{mode}: {n}")


@pytest.mark.slow
@pytest.mark.parametrize("mode", AC_MODES)
def test_compile_scope_blocks_traces_one_block_for_all(mode, monkeypatch):
    """train.compile_scope=blocks: each block and the head compiled on their own (aot_eager backend), under each
    checkpointing mode. The three blocks share one graph, the head has another; the gradients are the eager plain
    model's, and decoding through the cache stays eager (no new graph, the same tokens)."""
    from torch._dynamo.utils import counters
    idx = torch.randint(0, V, (2, T))
    plain = _make("gla", "none")
    loss, ref = _grads(plain, idx)
    torch._dynamo.reset()
    counters.clear()
    real = torch.compile
    monkeypatch.setattr(torch, "compile", lambda fn, mode=None, **kw: real(fn, backend="aot_eager", **kw))
    m = _make("gla", mode)
    m.set_activation_checkpointing(mode, compile_blocks=True)  # as train.py: full compiles each block's forward
    run = compile_model(m, scope="blocks")
    assert run is m and all(b.compiled_step is not None for b in m.blocks) and m.compiled_head is not None
    got_loss, got = _grads(m, idx, run)
    torch.testing.assert_close(got_loss, loss, rtol=1e-12, atol=1e-12)
    for n in ref:
        torch.testing.assert_close(got[n], ref[n], rtol=1e-12, atol=1e-12, msg=f"{mode}: {n}")
    assert counters["stats"]["unique_graphs"] == 2, dict(counters["stats"])  # one for 3 blocks, one for the head
    graphs = counters["stats"]["unique_graphs"]
    want = plain.generate(idx[:, :5], 4, temperature=0)
    assert torch.equal(m.generate(idx[:, :5], 4, temperature=0), want)
    assert counters["stats"]["unique_graphs"] == graphs  # with a cache, blocks and head run eagerly
    with pytest.raises(ValueError, match=r"valid choices: \['model', 'blocks'\]"):
        compile_model(m, scope="layers")


def test_bad_modes_are_refused(tmp_path):
    with pytest.raises(ValueError, match=r"valid choices: \['none', 'full', 'selective'\]"):
        _make("transformer", "some")
    for key, bad, match in (("activation_checkpointing", "half", r"\['none', 'full', 'selective'\]"),
                            ("nonfinite", "ignore", r"\['stop', 'skip'\]"),
                            ("compile_scope", "layers", r"\['model', 'blocks'\]")):
        with pytest.raises(ConfigError, match=f"train.{key}='{bad}'; valid choices: {match}"):
            train_lib.run(compose([f"out_dir={tmp_path}", f"train.{key}={bad}"]))


# ------------------------------------------------------------------------------------------------ non-finite guard
def test_the_first_nonfinite_module_is_named():
    m = _make("transformer", "none").float()
    idx = torch.randint(0, V, (2, T))
    batches = [(idx, idx), (idx, idx)]
    assert first_nonfinite_output(m, batches, torch.autocast("cpu", enabled=False)) is None
    calls = []  # the mixer of block 1 puts an inf at position 3 of the second micro-batch

    def inf_once(mod, args, out):
        calls.append(1)
        return out.index_fill(1, torch.tensor([3]), torch.inf) if len(calls) == 2 else out

    hook = m.blocks[1].mixer.register_forward_hook(inf_once)
    got = first_nonfinite_output(m, batches, torch.autocast("cpu", enabled=False))
    assert got == "blocks.1.mixer (SoftmaxAttention) in block 1 of 3, micro-batch 1", got
    hook.remove()
    _, loss = m(idx, idx)
    loss.backward()
    assert nonfinite_gradients(m) == []
    m.blocks[2].mlp.w2.weight.grad[0, 0] = float("nan")
    m.norm.weight.grad[1] = float("-inf")
    assert nonfinite_gradients(m) == ["blocks.2.mlp.w2.weight", "norm.weight"]


@pytest.fixture
def poison(monkeypatch):
    """Makes block 1's MLP output NaN (forward) or its gradient NaN (backward) at the chosen 0-based steps: the
    step is known from the objective's micro_batches(step), which the guard calls again to diagnose."""
    state = {"now": None, "forward": set(), "backward": set()}
    real_batches, real_build = Objective.micro_batches, train_lib.build_model

    def micro_batches(self, step):
        state["now"] = step
        yield from real_batches(self, step)
        state["now"] = None

    def hook(module, args, out):
        if state["now"] in state["forward"]:
            return out * float("nan")
        if state["now"] in state["backward"] and out.requires_grad:
            out.register_hook(lambda g: g * float("nan"))

    def build(*a, **kw):
        model = real_build(*a, **kw)
        model.blocks[1].mlp.register_forward_hook(hook)
        return model

    monkeypatch.setattr(Objective, "micro_batches", micro_batches)
    monkeypatch.setattr(train_lib, "build_model", build)
    return state


def test_nonfinite_stop_checkpoints_the_last_good_state_and_names_the_module(tmp_path, data_cache, poison):
    poison["forward"] = {4}
    cfg = tiny_overrides(tmp_path, data_cache, "train.steps=8", "train.ckpt_interval=3", "train.log_interval=1")
    with pytest.raises(NonFinite, match=r"^step 5: loss nan, gradient norm nan \(first non-finite output: "
                       r"blocks\.1\.mlp \(SwiGLU\) in block 1 of 2, micro-batch 0\); the weights were not updated\. "
                       r"The last good state is .*step_0000004\.pt \(resume=auto continues from it\); "
                       r"train\.nonfinite=skip skips"):
        train_lib.run(compose(cfg))
    ck = torch.load(tmp_path / "checkpoints" / "step_0000004.pt", weights_only=False)
    assert ck["step"] == 4 and all(torch.isfinite(v).all() for v in ck["model"].values())
    nf = json.loads((tmp_path / "nonfinite.json").read_text())  # what a sweep's launcher and grid read
    assert (nf["step"], nf["where"]) == (5, "first non-finite output: blocks.1.mlp (SwiGLU) in block 1 of 2, "
                                            "micro-batch 0") and nf["loss"] != nf["loss"]
    assert nf["message"].startswith("step 5: loss nan, gradient norm nan (first non-finite")
    assert (tmp_path / "checkpoints" / "latest").read_text() == "step_0000004.pt"
    assert [r["step"] for r in metrics_rows(tmp_path) if "loss" in r] == [1, 2, 3, 4]  # the bad step is not logged
    # the state it kept is the one an unpoisoned run has after 4 steps
    poison["forward"] = set()
    train_lib.run(compose(tiny_overrides(tmp_path / "clean", data_cache, "train.steps=8", "train.ckpt_interval=4")))
    clean = torch.load(tmp_path / "clean" / "checkpoints" / "step_0000004.pt", weights_only=False)["model"]
    assert all(torch.equal(clean[k], ck["model"][k]) for k in clean)


def test_nonfinite_skip_leaves_the_weights_and_counts_the_steps(tmp_path, data_cache, poison, capsys):
    poison["forward"], poison["backward"] = {1}, {3}
    cfg = tiny_overrides(tmp_path, data_cache, "train.steps=6", "train.log_interval=2", "train.nonfinite=skip",
                         "train.ckpt_interval=100")
    result = train_lib.run(compose(cfg))
    out = capsys.readouterr().out
    assert "step      2 | step 2: loss nan, gradient norm nan (first non-finite output: blocks.1.mlp (SwiGLU) in " \
           "block 1 of 2, micro-batch 0): skipped (train.nonfinite=skip), the weights are those of step 1" in out
    # a NaN made in backward: the re-run forward is finite, the gradients upstream of block 1's MLP are not (in
    # model order: the embedding first)
    assert re.search(r"step      4 \| step 4: loss 6\.\d+, gradient norm nan \(the forward is finite; non-finite "
                     r"gradients in wte\.weight, blocks\.0\.norm1\.weight, blocks\.0\.mixer\.qkv\.weight\): "
                     r"skipped", out)
    rows = [r for r in metrics_rows(tmp_path) if "loss" in r]
    assert [(r["step"], r["nonfinite_skipped"]) for r in rows] == [(2, 1), (4, 2), (6, 2)]
    assert all(r["loss"] == r["loss"] for r in rows) and result["loss"] == rows[-1]["loss"]  # no NaN in the means
    ck = torch.load(tmp_path / "checkpoints" / "step_0000006.pt", weights_only=False)
    assert ck["nonfinite_skipped"] == 2
    assert {s["step"].item() for s in ck["optimizer"]["state"].values()} == {4.0}  # 6 steps, 2 not taken


def test_a_skipped_first_step_moves_the_schedule_on_without_torchs_warning(tmp_path, data_cache, poison, recwarn):
    poison["forward"] = {0}
    cfg = tiny_overrides(tmp_path, data_cache, "train.steps=2", "train.log_interval=1", "train.nonfinite=skip",
                         "train.ckpt_interval=100")
    train_lib.run(compose(cfg))
    assert [(r["step"], r["nonfinite_skipped"]) for r in metrics_rows(tmp_path) if "loss" in r] == [(1, 1), (2, 1)]
    assert not [w for w in recwarn if "lr_scheduler.step()" in str(w.message)]
    ck = torch.load(tmp_path / "checkpoints" / "step_0000002.pt", weights_only=False)
    assert ck["scheduler"]["last_epoch"] == 2  # both steps counted by the schedule, one taken by AdamW
    assert {s["step"].item() for s in ck["optimizer"]["state"].values()} == {1.0}


def _saved_elements(fn, *args):
    """The elements of the storages autograd keeps for backward while fn(*args) runs forward (each storage counted
    once, as the allocator holds it), and fn's output."""
    seen = {}

    def pack(t):
        seen[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes() // t.element_size()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = fn(*args)
    return sum(seen.values()), out


@pytest.mark.parametrize("compiled", [False, True])
def test_swiglu_keeps_only_its_inputs_and_gives_autograds_gradients(compiled):
    """swiglu_linear = (silu(a) * b) W^T: the plain gradients (float64, awkward shapes), and backward keeps the
    [N, 2 x hidden] projection that a and b are halves of and W, never silu(a) or the product (eager: its
    autograd.Function; compiled: the min-cut partitioner that Inductor uses, told to recompute the product)."""
    from duality.model.core.layers import swiglu_linear
    torch.manual_seed(0)
    x = torch.randn(3, 7, 5, dtype=torch.float64)
    w13 = torch.randn(2 * 11, 5, dtype=torch.float64, requires_grad=True)
    w2 = torch.randn(5, 11, dtype=torch.float64, requires_grad=True)

    def fused(x, w13, w2):
        a, b = (x @ w13.t()).chunk(2, -1)
        return swiglu_linear(a, b, w2)

    def plain(x, w13, w2):
        a, b = (x @ w13.t()).chunk(2, -1)
        return (F.silu(a) * b) @ w2.t()

    torch._dynamo.reset()
    run = torch.compile(fused, backend="aot_eager_decomp_partition", fullgraph=True) if compiled else fused
    saved, y = _saved_elements(run, x, w13, w2)
    dy = torch.randn_like(y)
    grads = torch.autograd.grad(y, (w13, w2), dy)
    ref = plain(x, w13, w2)
    torch.testing.assert_close(y, ref, rtol=1e-12, atol=1e-12)
    for g, r in zip(grads, torch.autograd.grad(ref, (w13, w2), dy)):
        torch.testing.assert_close(g, r, rtol=1e-12, atol=1e-12)
    N = 3 * 7
    assert saved == N * 5 + N * 22 + 5 * 11  # x, x W_13^T (a and b are its halves), W_2
    assert _saved_elements(plain, x, w13, w2)[0] == saved + 2 * N * 11  # and silu(a), silu(a) * b


@pytest.mark.parametrize("compiled", [False, True])
@pytest.mark.parametrize("with_gate", [True, False])
def test_gated_output_norm_keeps_o_and_the_gate_and_gives_the_plain_gradients(with_gate, compiled):
    """GatedOutput's fused norm-gate against nn.RMSNorm(o) * silu(gate) written out (float64, a random norm weight,
    3 heads of 5): equal outputs and gradients of o, gate and every weight, and backward keeps o, the gate, the
    weights and 1/rms per head, where the plain modules keep the normalised o too (under autocast, fp32 copies).
    Compiled too (the partitioner Inductor uses): torch 2.11 once compiled this Function to zero gradients."""
    from duality.model.core.layers import OUTPUT_NORM_EPS, GatedOutput
    torch.manual_seed(0)
    B, T, H, D = 2, 7, 3, 5
    out = GatedOutput(11, H, D).double()
    with torch.no_grad():
        out.norm.weight.normal_()
    o = torch.randn(B, T, H, D, dtype=torch.float64, requires_grad=True)
    gate = torch.randn(B, T, H * D, dtype=torch.float64, requires_grad=True) if with_gate else None

    def plain(o, gate):
        n = F.rms_norm(o, (D,), out.norm.weight, OUTPUT_NORM_EPS).reshape(B, T, H * D)
        return out.o_proj(n * F.silu(gate) if gate is not None else n)

    torch._dynamo.reset()
    saved, y = _saved_elements(torch.compile(out, backend="aot_eager_decomp_partition") if compiled else out, o, gate)
    ref = plain(o, gate)
    torch.testing.assert_close(y, ref, rtol=1e-12, atol=1e-12)
    dy = torch.randn_like(y)
    inputs = [o, out.norm.weight, out.o_proj.weight] + ([gate] if with_gate else [])
    for g, r in zip(torch.autograd.grad(y, inputs, dy), torch.autograd.grad(ref, inputs, dy)):
        torch.testing.assert_close(g, r, rtol=1e-12, atol=1e-12)
    N = B * T * H * D
    # o, the gate, 1/rms, the norm weight, the o_proj input and weight (compiled: the partitioner may keep less)
    assert saved <= N + (N if with_gate else 0) + B * T * H + D + N + 11 * H * D
    assert compiled or saved == N + (N if with_gate else 0) + B * T * H + D + N + 11 * H * D
    assert _saved_elements(plain, o, gate)[0] >= saved + N  # at least the normalised o (fp64: no upcast copies)


@pytest.mark.parametrize("compiled", [False, True])
def test_l2norm_keeps_its_output_and_gives_autograds_gradients(compiled):
    """l2norm = x / sqrt(|x|^2 + eps): the plain formula's output and gradient (float64, rows of 7), and backward
    keeps y and one r per row. x is a view into a buffer three times its size (DeltaNet's q in [q | k | v]): the
    plain formula keeps x, and so the whole buffer."""
    from duality.model.core.layers import l2norm
    torch.manual_seed(0)
    buf = torch.randn(3, 5, 3 * 7, dtype=torch.float64, requires_grad=True)

    def fused(buf):
        return l2norm(buf[..., :7])

    def plain(buf):
        x = buf[..., :7]
        return x / torch.sqrt(x.square().sum(-1, keepdim=True) + 1e-6)

    torch._dynamo.reset()
    saved, y = _saved_elements(torch.compile(fused, backend="aot_eager_decomp_partition") if compiled else fused, buf)
    ref = plain(buf)
    torch.testing.assert_close(y, ref, rtol=1e-12, atol=1e-12)
    dy = torch.randn_like(y)
    torch.testing.assert_close(torch.autograd.grad(y, buf, dy)[0], torch.autograd.grad(ref, buf, dy)[0],
                               rtol=1e-12, atol=1e-12)
    assert saved == 3 * 5 * 7 + 3 * 5  # y, r
    assert _saved_elements(plain, buf)[0] >= buf.numel()  # the whole buffer


def test_split_linear_is_the_linear_in_parts_of_their_own():
    """split_linear(x, linear, sizes) == linear(x).split(sizes) with its gradients (float64, with a bias), each part
    a buffer of its own (so keeping one for backward does not keep the others)."""
    from duality.model.core.layers import split_linear
    torch.manual_seed(0)
    lin = nn.Linear(5, 3 + 0 + 8, bias=True).double()
    x = torch.randn(2, 7, 5, dtype=torch.float64, requires_grad=True)
    parts = split_linear(x, lin, [3, 0, 8])
    ref = lin(x).split([3, 0, 8], -1)
    for p, r in zip(parts, ref):
        torch.testing.assert_close(p, r, rtol=1e-12, atol=1e-12)
    assert len({p.untyped_storage().data_ptr() for p in parts if p.numel()}) == 2
    assert all(p.untyped_storage().nbytes() == p.numel() * 8 for p in parts)
    dys = [torch.randn_like(p) for p in parts]
    wrt = (x, lin.weight, lin.bias)
    for g, r in zip(torch.autograd.grad(parts, wrt, dys), torch.autograd.grad(ref, wrt, dys)):
        torch.testing.assert_close(g, r, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("compiled", [False, True])
def test_split_linear_under_autocast_keeps_one_copy_of_its_input(compiled):
    """Under autocast an fp32 x is cast to bf16 for each matmul; split_linear's backward keeps one bf16 copy of x,
    not one per part (eager: it casts x once; compiled: Inductor's partitioner after CSE)."""
    from duality.model.core.layers import split_linear
    torch.manual_seed(0)
    lin = nn.Linear(16, 24, bias=False)
    x = torch.randn(2, 5, 16, requires_grad=True) * 1.0  # not a leaf: autocast caches the casts of leaves only
    copies = set()

    @torch._dynamo.disable
    def pack(t):
        if t.dtype == torch.bfloat16 and t.numel() == x.numel():  # x, or x as [10, 16]
            copies.add(t.untyped_storage().data_ptr())
        return t

    torch._dynamo.reset()
    run = torch.compile(split_linear, backend="aot_eager_decomp_partition") if compiled else split_linear
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), torch.autocast("cpu", dtype=torch.bfloat16):
        parts = run(x, lin, [16, 8])
    assert [p.dtype for p in parts] == [torch.bfloat16] * 2 and len(copies) == 1


@pytest.mark.parametrize("compiled", [False, pytest.param(True, marks=pytest.mark.slow)])
@pytest.mark.parametrize("backbone", ["gla", "retnet", "mamba2", "gated_oja", "deltanet", "gated_deltanet",
                                      "linear_attn"])
def test_backward_keeps_no_buffer_it_does_not_use(backbone, compiled):
    """Autograd keeps a saved view's whole buffer alive. With the recurrences and the short convolution treating
    their inputs as FLA's kernels do on the GPU (the recurrence keeps contiguous copies; causal_conv1d keeps x as
    given; both break a compiled graph), at least 90% of every buffer kept for backward is reached by what is kept
    (the rest: beta and the decay's input, H of 4 d + 2 H columns), eager and compiled (the partitioner Inductor
    uses). Before split_linear and the l2norm that keeps its output: RetNet's output gate kept all of
    [q | k | v | gate] (25% used), GLA's 38%, DeltaNet's q and k the whole convolution output (67%)."""
    from saved_activations import fla_like_kernels
    torch.manual_seed(0)
    m = build_model({"name": backbone}, {"name": "nope"}, {"n_layer": 2, "d_model": 64, "n_heads": 2, "seq_len": 16},
                    V)
    params = {p.untyped_storage().data_ptr() for p in m.parameters()}
    kept = {}  # buffer -> the element mask of it that kept tensors reach

    @torch._dynamo.disable  # runs as the tensors are kept, not traced into the graph
    def pack(t):
        s = t.untyped_storage()
        if s.data_ptr() not in params:
            mask = kept.setdefault(s.data_ptr(), torch.zeros(s.nbytes() // t.element_size(), dtype=torch.bool))
            mask.as_strided(t.shape, t.stride(), (t.data_ptr() - s.data_ptr()) // t.element_size()).fill_(True)
        return t

    x, y = torch.randint(0, V, (3, 16)), torch.randint(0, V, (3, 16))
    torch._dynamo.reset()
    run = torch.compile(m, backend="aot_eager_decomp_partition") if compiled else m
    with fla_like_kernels() as calls, torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        run(x, y)
    assert calls["recurrence"] == 2, calls  # the stand-in ran in both layers
    used = sorted(mask.float().mean().item() for mask in kept.values())
    assert len(used) > 10 and used[0] >= 0.9, used


# inputs the recurrence must copy, per layer: RetNet's per-head decay is one constant row broadcast over the batch
# ([B, T, H, 1], tiny); DeltaNet's v is a view of the one short convolution over [q | k | v] (q and k are not: the
# L2 norm writes them anew); GLA with its short convolution likewise hands q, k and v as views of its output
COPIED_PER_LAYER = {"gla": 0, "retnet": 1, "mamba2": 0, "gated_oja": 0, "linear_attn": 0, "deltanet": 1,
                    "gated_deltanet": 1, "gla+short_conv": 3}


@pytest.mark.parametrize("compiled", [False, pytest.param(True, marks=pytest.mark.slow)])
@pytest.mark.parametrize("backbone", list(COPIED_PER_LAYER))
def test_recurrences_get_inputs_they_need_not_copy(backbone, compiled):
    """q, k and v come from matmuls of their own (split_linear), so they reach the recurrence contiguous and FLA's
    kernels copy none of them: views of one [q | k | v] output were copied forward and their gradients concatenated
    backward (1.5% of GLA's 370m/4096 step on an H200, docs/throughput). Counted with the stand-ins of FLA's kernels,
    eager and compiled."""
    from saved_activations import fla_like_kernels
    name, _, conv = backbone.partition("+")
    torch.manual_seed(0)
    m = build_model({"name": name, **({"short_conv": True} if conv else {})}, {"name": "nope"},
                    {"n_layer": 2, "d_model": 64, "n_heads": 2, "seq_len": 16}, V)
    torch._dynamo.reset()
    run = torch.compile(m, backend="aot_eager_decomp_partition") if compiled else m
    with fla_like_kernels() as calls:
        run(torch.randint(0, V, (3, 16)), torch.randint(0, V, (3, 16)))
    assert calls["recurrence"] == 2, calls
    assert calls["copied"] == 2 * COPIED_PER_LAYER[backbone], calls
