"""The decayed-attention primitive (kernels/attention/): softmax and symmetric-power scores, forget-gate log-decays,
ALiBi slopes, packed documents. The reference is checked against the formula written out per query in float64; the
Triton kernel runs in Triton's interpreter on a CPU (conftest sets TRITON_INTERPRET=1 without a GPU) and is checked
against the float64 reference, forward and every gradient, at lengths that are not multiples of the blocks and
across document boundaries."""

import math

import pytest
import torch
import torch.nn.functional as F
from conftest import DEV, interp, qkv

from duality.kernels.attention import INTERPRETER_CONFIG, decayed_attention, decayed_attention_reference

VARIANTS = {  # name: (power, gate, alibi)
    "softmax": (None, False, False), "fox": (None, True, False), "alibi": (None, False, True),
    "sympow2": (2, False, False), "sympow2_gated": (2, True, False), "sympow4_gated": (4, True, False),
    "sympow4_alibi": (4, False, True),
}


def inputs(B, T, H, D, gate, alibi, dtype=torch.float64, seed=0):
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(B, T, H, D, generator=g, dtype=torch.float64) for _ in range(3))
    c = torch.cumsum(F.logsigmoid(torch.randn(B, T, H, generator=g, dtype=torch.float64) + 2), 1) if gate else None
    m = 2.0 ** (-8.0 * torch.arange(1, H + 1, dtype=torch.float64) / H) if alibi else None
    cast = (lambda t: None if t is None else t.to(dtype))
    return cast(q), cast(k), cast(v), cast(c), m


def direct(q, k, v, c, m, power, docs=None):
    """o_i = sum_j w_ij v_j / sum_j w_ij over j <= i in i's document, one query at a time, float64."""
    B, T, H, D = q.shape
    docs = docs or [(0, T)]
    out = torch.zeros(B, T, H, D, dtype=torch.float64)
    for lo, hi in docs:
        for i in range(lo, hi):
            j = torch.arange(lo, i + 1)
            s = torch.einsum("bhd,bjhd->bhj", q[:, i].double(), k[:, lo:i + 1].double()) / math.sqrt(D)
            a = torch.zeros_like(s)
            if c is not None:
                a = a + (c[:, i, :, None] - c[:, lo:i + 1].transpose(1, 2)).double()
            if m is not None:
                a = a - m.double()[:, None] * (i - j).double()
            w = torch.softmax(s + a, -1) if power is None else s ** power * torch.exp(a)
            w = w / w.sum(-1, keepdim=True)
            out[:, i] = torch.einsum("bhj,bjhd->bhd", w, v[:, lo:i + 1].double())
    return out


@pytest.mark.parametrize("name", list(VARIANTS))
def test_reference_is_the_formula(name):
    power, gate, alibi = VARIANTS[name]
    q, k, v, c, m = inputs(2, 19, 3, 8, gate, alibi)
    got = decayed_attention_reference(q, k, v, log_decay=c, slopes=m, power=power)
    torch.testing.assert_close(got, direct(q, k, v, c, m, power), rtol=1e-12, atol=1e-12)
    # the CPU entry point (SDPA with a mask for softmax, the reference in fp32 for powers) agrees too
    torch.testing.assert_close(decayed_attention(q, k, v, log_decay=c, slopes=m, power=power), got)


def test_reference_packed_documents_and_decoding_rows():
    q, k, v, c, _ = inputs(1, 23, 2, 8, True, False)
    cu = torch.tensor([0, 7, 8, 23])
    got = decayed_attention_reference(q, k, v, log_decay=c, power=2, cu_seqlens=cu)
    torch.testing.assert_close(got, direct(q, k, v, c, None, 2, [(0, 7), (7, 8), (8, 23)]), rtol=1e-12, atol=1e-12)
    # the last Tq queries against all Tk keys (a KV cache) == the last rows of the full computation
    full = decayed_attention(q, k, v, log_decay=c, power=4)
    torch.testing.assert_close(decayed_attention(q[:, -5:], k, v, log_decay=c, power=4), full[:, -5:])


def test_reference_gradcheck():
    q, k, v, c, m = inputs(1, 6, 2, 4, True, True)
    args = [t.clone().requires_grad_() for t in (q, k, v, c)]
    for power in (None, 2, 4):
        assert torch.autograd.gradcheck(
            lambda q, k, v, c: decayed_attention_reference(q, k, v, log_decay=c, slopes=m, power=power), args)


def _kernel_vs_reference(power, gate, alibi, B, T, H, D, cu=None, dtype=torch.float32, seed=0):
    q, k, v, c, m = inputs(B, T, H, D, gate, alibi, seed=seed)
    ref_in = [t.clone().requires_grad_() for t in (q, k, v)] + ([c.clone().requires_grad_()] if gate else [])
    ker_in = [t.to(DEV, dtype).requires_grad_() for t in (q, k, v)]
    ker_in += [c.to(DEV).float().requires_grad_()] if gate else []
    want = decayed_attention_reference(*ref_in[:3], log_decay=ref_in[3] if gate else None, slopes=m, power=power,
                                       cu_seqlens=cu)
    got = decayed_attention(*ker_in[:3], log_decay=ker_in[3] if gate else None,
                            slopes=None if m is None else m.to(DEV).float(), power=power,
                            cu_seqlens=None if cu is None else cu.to(DEV), impl="triton")
    do = torch.randn(B, T, H, D, dtype=torch.float64, generator=torch.Generator().manual_seed(seed + 1))
    g_want = torch.autograd.grad(want, ref_in, do)
    g_got = torch.autograd.grad(got, ker_in, do.to(DEV, dtype))
    tol = 2e-5 if dtype == torch.float32 else 2e-2
    err = lambda a, b: ((a.double().cpu() - b).norm() / b.norm()).item()  # noqa: E731
    assert err(got, want) < tol, ("o", err(got, want))
    for name, a, b in zip("qkvc", g_got, g_want):
        assert err(a, b) < tol * (2 if dtype == torch.float32 else 1), (name, err(a, b))


@interp
@pytest.mark.parametrize("name", list(VARIANTS))
def test_kernel_matches_reference(name):
    """T = 77: neither the interpreter's 32-token held blocks nor the 16-token inner blocks divide it."""
    power, gate, alibi = VARIANTS[name]
    assert 77 % INTERPRETER_CONFIG["block"] and 77 % INTERPRETER_CONFIG["fwd"][0]
    _kernel_vs_reference(power, gate, alibi, B=2, T=77, H=2, D=16)


@interp
@pytest.mark.parametrize("name", ["fox", "sympow2_gated", "sympow4_gated", "alibi"])
def test_kernel_packed_documents(name):
    """Boundaries inside a block, at a block edge, a one-token document: each document as if alone."""
    power, gate, alibi = VARIANTS[name]
    _kernel_vs_reference(power, gate, alibi, B=1, T=100, H=2, D=16, cu=torch.tensor([0, 13, 32, 33, 100]))


# Half precision: bf16 on a GPU; the interpreter multiplies bf16 bit patterns in tl.dot (triton issue #11584, "not
# supported yet"), so there fp16, which takes the same path (inputs and weights rounded to 16 bits, fp32 sums).
HALF = torch.bfloat16 if torch.cuda.is_available() else torch.float16


@interp
@pytest.mark.parametrize("D", [32, 64])
def test_kernel_head_sizes_and_half_precision(D):
    _kernel_vs_reference(2, True, False, B=1, T=40, H=1, D=D)
    _kernel_vs_reference(None, True, False, B=1, T=40, H=1, D=D, dtype=HALF, seed=3)
    _kernel_vs_reference(4, True, False, B=1, T=40, H=1, D=D, dtype=HALF, seed=4)


@interp
def test_alibi_is_a_constant_gate_through_the_kernel():
    """Seed 003 appendix A.1 in the kernel: slopes m_h == the log-decay c_t = -m_h t (a constant gate e^{-m_h}),
    for softmax (ALiBi vs FoX) and for power scores (sympow + ALiBi vs gated sympow)."""
    q, k, v, _, m = inputs(2, 50, 4, 16, False, True, dtype=torch.float32)
    q, k, v, m = q.to(DEV), k.to(DEV), v.to(DEV), m.to(DEV).float()
    c = -(m * torch.arange(50.0, device=DEV)[:, None])[None].expand(2, -1, -1)
    for power in (None, 2):
        a = decayed_attention(q, k, v, slopes=m, power=power, impl="triton")
        b = decayed_attention(q, k, v, log_decay=c, power=power, impl="triton")
        torch.testing.assert_close(a, b, rtol=2e-5, atol=2e-5)


def test_bad_arguments_are_named():
    q = torch.randn(1, 8, 2, 16)
    with pytest.raises(ValueError, match="power must be an even integer"):
        decayed_attention(q, q, q, power=3)
    with pytest.raises(ValueError, match="log_decay must be"):
        decayed_attention(q, q, q, log_decay=torch.zeros(1, 8, 3))
    with pytest.raises(ValueError, match="slopes must be"):
        decayed_attention(q, q, q, slopes=torch.zeros(3))
    with pytest.raises(ValueError, match="bias b_ij needs softmax"):
        decayed_attention(q, q, q, bias=torch.zeros(1, 2, 8, 8), power=2)
    with pytest.raises(ValueError, match="impl must be"):
        decayed_attention(q, q, q, impl="cuda")
    with pytest.raises(ValueError, match="packed input"):
        decayed_attention(torch.randn(2, 8, 2, 16), torch.randn(2, 8, 2, 16), torch.randn(2, 8, 2, 16),
                          cu_seqlens=torch.tensor([0, 8]))
    with pytest.raises(ValueError, match="impl='triton' needs"):
        decayed_attention(q.double(), q.double(), q.double(), power=2, impl="triton")


def test_cumulative_log_decay_is_a_cumsum_over_time():
    """c_t = sum_{s<=t} f_s along dim 1, for [B, T, H] and [B, T, H, K] gates, in fp32 at least (float64 kept)."""
    from duality.kernels.attention import cumulative_log_decay
    torch.manual_seed(0)
    for shape in ((2, 37, 3), (2, 37, 3, 4)):
        f = torch.nn.functional.logsigmoid(torch.randn(*shape, dtype=torch.float64))
        torch.testing.assert_close(cumulative_log_decay(f), torch.cumsum(f, 1), rtol=1e-12, atol=1e-12)
        assert cumulative_log_decay(f.bfloat16()).dtype == torch.float32


@pytest.mark.parametrize("Tq,Tk", [(13, 13), (1, 13), (5, 13)])
@pytest.mark.parametrize("with_decay,with_bias", [(False, False), (True, False), (False, True), (True, True)])
def test_decayed_attention_sdpa_path_matches_formula(Tq, Tk, with_decay, with_bias):
    q, k, v = qkv(T=Tq, Tk=Tk)
    log_decay = torch.cumsum(torch.nn.functional.logsigmoid(torch.randn(2, Tk, 3)), 1) if with_decay else None
    bias = torch.randn(2, 3, Tq, Tk) if with_bias else None
    out = decayed_attention(q, k, v, log_decay=log_decay, bias=bias)
    # independent loop over query positions: softmax over keys j <= i of q.k/sqrt(D) + c_i - c_j + b_ij
    ref = torch.empty_like(out)
    for n in range(Tq):
        i = Tk - Tq + n
        s = torch.einsum("bhd,bjhd->bhj", q[:, n], k[:, : i + 1]) / math.sqrt(8)
        if with_decay:
            s = s + (log_decay[:, i, :, None] - log_decay[:, : i + 1].transpose(1, 2))
        if with_bias:
            s = s + bias[:, :, n, : i + 1]
        ref[:, n] = torch.einsum("bhj,bjhd->bhd", torch.softmax(s, -1), v[:, : i + 1])
    torch.testing.assert_close(out, ref)
    torch.testing.assert_close(decayed_attention_reference(q, k, v, log_decay=log_decay, bias=bias), ref)


@pytest.mark.parametrize("case", ["softmax", "fox", "alibi", "fox_alibi", "sympow2"])
def test_cached_attention_over_a_buffer_equals_decayed_attention_over_its_filled_keys(case):
    """cached_attention (queries at a position given as a tensor, keys in a fixed buffer whose later rows hold
    garbage) equals decayed_attention over the first offset + Tq keys, float64, for one and for three queries."""
    from duality.kernels.attention import cached_attention_reference
    torch.manual_seed(0)
    B, L, H, D = 2, 23, 3, 16
    k, v = torch.randn(B, L, H, D, dtype=torch.float64), torch.randn(B, L, H, D, dtype=torch.float64)
    c = torch.cumsum(torch.nn.functional.logsigmoid(torch.randn(B, L, H, dtype=torch.float64)), 1)
    kw = {"log_decay": c if "fox" in case else None, "slopes": torch.rand(H, dtype=torch.float64)
          if "alibi" in case else None, "power": 2 if case == "sympow2" else None}
    for pos, Tq in ((9, 1), (14, 3), (0, 1)):
        q = torch.randn(B, Tq, H, D, dtype=torch.float64)
        n = pos + Tq
        want = decayed_attention(q, k[:, :n], v[:, :n], impl="torch",
                                 **{**kw, "log_decay": None if kw["log_decay"] is None else c[:, :n]})
        got = cached_attention_reference(q, k, v, torch.tensor(pos), **kw)
        torch.testing.assert_close(got, want, rtol=0, atol=1e-12)


@interp
@pytest.mark.parametrize("case", ["softmax", "fox", "alibi"])
@pytest.mark.parametrize("L,pos", [(200, 0), (200, 130), (200, 199), (77, 40)])
def test_decode_kernel_matches_the_reference(case, L, pos):
    """decode.py's split-key kernel (interpreter on a CPU) against cached_attention_reference: one query at `pos` of
    a buffer of L keys whose rows past pos are garbage (never read), splits that end before, at and after pos, in
    fp32 and bf16."""
    from duality.kernels.attention import cached_attention, cached_attention_reference
    from duality.kernels.attention import decode as dec
    torch.manual_seed(1)
    B, H, D = 2, 3, 32
    for dtype, tol in ((torch.float32, 1e-5), (torch.bfloat16, 2e-2)):
        q = torch.randn(B, 1, H, D, device=DEV).to(dtype)
        k, v = (torch.randn(B, L, H, D, device=DEV).to(dtype) for _ in range(2))
        c = torch.cumsum(torch.nn.functional.logsigmoid(torch.randn(B, L, H, device=DEV)), 1)
        kw = {"log_decay": c if case == "fox" else None, "slopes": torch.rand(H, device=DEV) if case == "alibi"
              else None}
        offset = torch.tensor(pos, device=DEV)
        want = cached_attention_reference(q.double(), k.double(), v.double(), offset, **{
            n: (x.double() if x is not None else None) for n, x in kw.items()})
        got = cached_attention(q, k, v, offset, impl="triton", **kw)
        assert got.dtype == dtype and got.shape == q.shape
        err = ((got.double() - want).norm() / want.norm()).item()
        assert err < tol, (dtype, err)
    assert dec.decode_ok(q, k) and not dec.decode_ok(q, k, power=2) and not dec.decode_ok(q.expand(B, 2, H, D), k)
