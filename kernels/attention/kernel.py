"""The flash-style Triton kernel of decayed attention, forward and backward (kernels/attention/__init__.py says
how it works), with its autograd wrapper and the test of when it applies."""

from __future__ import annotations

import os

import torch

try:
    import triton
    import triton.language as tl
except ImportError:  # CPU-only installs: the reference
    triton = None

from ..varlen import block_table

if triton is not None:
    from ..varlen import chunk as _chunk

LOG2E = 1.4426950408889634


if triton is not None:
    _L2E = tl.constexpr(LOG2E)

    @triton.jit
    def _tile(tab, cu, T, NB, SLOPES, BLOCK: tl.constexpr, VARLEN: tl.constexpr, KEYS: tl.constexpr,
              ALIBI: tl.constexpr):
        """This program's head h and block of BLOCK tokens: its document [bos, eos), first token t0, the tokens
        t0 + [0, BLOCK) with their in-document mask, and the head's ALiBi slope (the rotation kernel's chunk lookup).
        Programs take the blocks with the most work first (the last query blocks, the first key blocks), so the
        short ones fill the tail; a packed batch's table is sorted that way already."""
        pid, h = tl.program_id(0), tl.program_id(1)
        if KEYS:
            pid = tl.num_programs(0) - 1 - pid
        if not VARLEN:
            pid += NB - 1 - 2 * (pid % NB)  # a sequence's blocks last to first
        t0, eos, i, _ = _chunk(pid, tab, cu, T, NB, BLOCK, VARLEN)
        t = t0 + tl.arange(0, BLOCK)
        slope = tl.load(SLOPES + h) if ALIBI else 0.0
        return h, t0 - i * BLOCK, eos, t0, t, t < eos, slope

    @triton.jit
    def _rows(X, t, s_t, h, mask, D: tl.constexpr):
        """The [len(t), D] tile of head h at tokens t of a [N, H, D] tensor with token stride s_t (0 where masked)."""
        return tl.load(X + t[:, None] * s_t + h * D + tl.arange(0, D)[None, :], mask=mask[:, None], other=0)

    @triton.jit
    def _cdiff(C, slope, t, ref, h, N, mask, DECAY: tl.constexpr, ALIBI: tl.constexpr):
        """(c_t - c_ref) - m (t - ref) for a vector of positions t (fp32; 0 without decay). Per-token arrays are
        [H, N] (N tokens in all), so a block's entries are contiguous."""
        d = tl.zeros(t.shape, dtype=tl.float32)
        if DECAY:
            d += tl.load(C + h * N + t, mask=mask, other=0) - tl.load(C + h * N + ref)
        if ALIBI:
            d -= slope * (t - ref).to(tl.float32)
        return d

    @triton.jit
    def _cshift(C, slope, r, ref, h, N, DECAY: tl.constexpr, ALIBI: tl.constexpr):
        """(c_r - c_ref) - m (r - ref) for one position r."""
        d = 0.0
        if DECAY:
            d += tl.load(C + h * N + r) - tl.load(C + h * N + ref)
        if ALIBI:
            d -= slope * (r - ref).to(tl.float32)
        return d

    @triton.jit
    def _powp(s, POWER: tl.constexpr):
        """s^(POWER - 1) and s^POWER by repeated multiplication (POWER even)."""
        s2 = s * s
        lo = s
        for _ in tl.static_range(POWER // 2 - 1):
            lo = lo * s2
        return lo, lo * s

    @triton.jit
    def _fwd_steps(acc, l, m, q, rows, cr, K, V, C, slope, h, m0, lo, hi, eos, scale, s_kt, s_vt, N,
                   D: tl.constexpr, BN: tl.constexpr, POWER: tl.constexpr, DECAY: tl.constexpr,
                   ALIBI: tl.constexpr, MASKED: tl.constexpr, PREC: tl.constexpr):
        for n0 in range(lo, hi, BN):
            cols = n0 + tl.arange(0, BN)
            kmask = cols < eos
            k = _rows(K, cols, s_kt, h, kmask, D)
            v = _rows(V, cols, s_vt, h, kmask, D)
            s = tl.dot(q, tl.trans(k), input_precision=PREC)
            if MASKED:
                allowed = (cols[None, :] <= rows[:, None]) & kmask[None, :]
            if POWER == 0:  # softmax in base 2: z = (s * scale + c_i - c_j) log2(e)
                z = s * (scale * _L2E)
                if DECAY or ALIBI:
                    cc = _cdiff(C, slope, cols, m0, h, N, kmask, DECAY, ALIBI)
                    z += cr[:, None] - (cc * _L2E)[None, :]
                if MASKED:
                    z = tl.where(allowed, z, float("-inf"))
                m_new = tl.maximum(m, tl.max(z, 1))
                alpha = tl.exp2(m - m_new)
                p = tl.exp2(z - m_new[:, None]).to(v.dtype)
                l = l * alpha + tl.sum(p.to(tl.float32), 1)
                acc = acc * alpha[:, None]
                m = m_new
            else:
                _, p = _powp(s * scale, POWER)
                if MASKED:
                    if DECAY or ALIBI:
                        cc = _cdiff(C, slope, cols, m0, h, N, kmask, DECAY, ALIBI)
                        p = p * tl.exp2((cr[:, None] - cc[None, :]) * _L2E)
                    p = tl.where(allowed, p, 0.0)
                elif DECAY or ALIBI:  # exp(c_i - c_r) exp(c_r - c_j), r = this block's last key
                    r = n0 + BN - 1
                    ri = cr - _cshift(C, slope, r, m0, h, N, DECAY, ALIBI)
                    rj = _cdiff(C, slope, cols, r, h, N, kmask, DECAY, ALIBI)
                    p = p * tl.exp2(ri * _L2E)[:, None] * tl.exp2(-rj * _L2E)[None, :]
                p = p.to(v.dtype)
                l += tl.sum(p.to(tl.float32), 1)
            # l sums the weights as the product below sees them (rounded to v's dtype), so the output's weights sum to
            # one exactly: with unrounded sums, a one-key row (T = 1) gave o != v_0 by bf16 rounding, and the power
            # path's dL/ds = p s^(p-1) (dP - Delta) / l turned that into q, k gradients of 1e-2 where the true ones
            # are 0
            acc = tl.dot(p, v, acc, input_precision=PREC)
        return acc, l, m

    @triton.jit
    def _fwd_kernel(Q, K, V, C, SLOPES, O, L, tab, cu, scale, T, NB, s_qt, s_kt, s_vt, s_ot, N,
                    H: tl.constexpr, D: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, POWER: tl.constexpr,
                    DECAY: tl.constexpr, ALIBI: tl.constexpr, VARLEN: tl.constexpr,
                    PREC: tl.constexpr):
        h, bos, eos, m0, rows, rmask, slope = _tile(tab, cu, T, NB, SLOPES, BM, VARLEN, False, ALIBI)
        d = tl.arange(0, D)
        q = _rows(Q, rows, s_qt, h, rmask, D)
        cr = _cdiff(C, slope, rows, m0, h, N, rmask, DECAY, ALIBI) * (_L2E if POWER == 0 else 1.0)
        acc = tl.zeros([BM, D], dtype=tl.float32)
        l = tl.zeros([BM], dtype=tl.float32)
        m = tl.full([BM], float("-inf"), dtype=tl.float32)
        # keys before the block (no mask; BM is a multiple of BN so they end exactly at m0), then the diagonal
        acc, l, m = _fwd_steps(acc, l, m, q, rows, cr, K, V, C, slope, h, m0, bos, m0, eos, scale, s_kt, s_vt,
                               N, D, BN, POWER, DECAY, ALIBI, False, PREC)
        acc, l, m = _fwd_steps(acc, l, m, q, rows, cr, K, V, C, slope, h, m0, m0, tl.minimum(m0 + BM, eos), eos,
                               scale, s_kt, s_vt, N, D, BN, POWER, DECAY, ALIBI, True, PREC)
        l = tl.where(l == 0, 1.0, l)  # a row whose every score is 0 (power path) outputs 0, not NaN
        tl.store(O + rows[:, None] * s_ot + h * D + d[None, :], (acc / l[:, None]).to(O.dtype.element_ty),
                 mask=rmask[:, None])
        # the row statistic the backward pass needs: log2 of the softmax normaliser, or the power path's sum
        tl.store(L + h * N + rows, m + tl.log2(l) if POWER == 0 else l, mask=rmask)

    @triton.jit
    def _probs(s, L, cr, cc, scale, POWER: tl.constexpr, DECAY: tl.constexpr, ALIBI: tl.constexpr,
               MASKED: tl.constexpr):
        """Weights P and G with dL/ds = G * (dP - Delta) for a tile of scores s in either orientation ([queries,
        keys] or its transpose; L, cr (per query) and cc (per key) come broadcastable to it): softmax G = P, power
        G = p s^(p-1) b / l. cr, cc: log-decays relative to a common reference; off the diagonal (not MASKED) the
        power path's reference is the key block's last key r and cc = c_r - c_j."""
        if POWER == 0:
            z = s * (scale * _L2E)
            if DECAY or ALIBI:
                z += (cr - cc) * _L2E
            p = tl.exp2(z - L)
            return p, p
        lo, hi = _powp(s * scale, POWER)
        inv = 1.0 / L
        if DECAY or ALIBI:
            if not MASKED:
                col = tl.exp2(cc * _L2E)
                inv = inv * tl.exp2(cr * _L2E)
            else:
                col = tl.exp2((cr - cc) * _L2E)
            lo = lo * col
            hi = hi * col
        return hi * inv, lo * (POWER * inv)

    @triton.jit
    def _dkdv_steps(dk, dv, dc, k, v, cols, kmask, Q, DO, L, DL, C, slope, h, n0, lo, hi, eos, scale, s_qt, s_dot,
                    N, H: tl.constexpr, D: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr,
                    POWER: tl.constexpr, DECAY: tl.constexpr, ALIBI: tl.constexpr, MASKED: tl.constexpr,
                  PREC: tl.constexpr):
        if POWER != 0 and not MASKED:  # off-diagonal power path: exp(c_r - c_j) per key, exp(c_i - c_r) per query
            r = tl.minimum(n0 + BN, eos) - 1
            cc = -_cdiff(C, slope, cols, r, h, N, kmask, DECAY, ALIBI)
        else:
            r = n0
            cc = _cdiff(C, slope, cols, r, h, N, kmask, DECAY, ALIBI)
        for m0 in range(lo, hi, BM):
            rows = m0 + tl.arange(0, BM)
            rmask = rows < eos
            q = _rows(Q, rows, s_qt, h, rmask, D)
            do = _rows(DO, rows, s_dot, h, rmask, D)
            Lr = tl.load(L + h * N + rows, mask=rmask, other=1.0)
            Dr = tl.load(DL + h * N + rows, mask=rmask, other=0)
            cr = _cdiff(C, slope, rows, r, h, N, rmask, DECAY, ALIBI)
            sT = tl.dot(k, tl.trans(q), input_precision=PREC)
            pT, gT = _probs(sT, Lr[None, :], cr[None, :], cc[:, None], scale, POWER, DECAY, ALIBI, MASKED)
            allowed = rmask[None, :] & kmask[:, None]
            if MASKED:
                allowed = allowed & (cols[:, None] <= rows[None, :])
            pT = tl.where(allowed, pT, 0.0)
            gT = tl.where(allowed, gT, 0.0)
            dv = tl.dot(pT.to(do.dtype), do, dv, input_precision=PREC)
            dpT = tl.dot(v, tl.trans(do), input_precision=PREC) - Dr[None, :]
            dsT = gT * dpT
            dk = tl.dot(dsT.to(q.dtype), q, dk, input_precision=PREC)
            if DECAY:
                dc -= tl.sum(pT * dpT, 1)
        return dk, dv, dc

    @triton.jit
    def _dkdv_kernel(Q, K, V, C, SLOPES, DO, L, DL, DK, DV, DC, tab, cu, scale, T, NB, s_qt, s_kt, s_vt,
                     s_dot, N, H: tl.constexpr, D: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr,
                     POWER: tl.constexpr, DECAY: tl.constexpr, ALIBI: tl.constexpr, VARLEN: tl.constexpr,
                     PREC: tl.constexpr):
        """One block of BN keys: dk, dv and dc (= -sum_i dz_ij) from every query after it (BN a multiple of BM)."""
        h, bos, eos, n0, cols, kmask, slope = _tile(tab, cu, T, NB, SLOPES, BN, VARLEN, True, ALIBI)
        d = tl.arange(0, D)
        k = _rows(K, cols, s_kt, h, kmask, D)
        v = _rows(V, cols, s_vt, h, kmask, D)
        dk = tl.zeros([BN, D], dtype=tl.float32)
        dv = tl.zeros([BN, D], dtype=tl.float32)
        dc = tl.zeros([BN], dtype=tl.float32)
        diag_end = tl.minimum(n0 + BN, eos)
        dk, dv, dc = _dkdv_steps(dk, dv, dc, k, v, cols, kmask, Q, DO, L, DL, C, slope, h, n0, n0, diag_end, eos,
                                 scale, s_qt, s_dot, N, H, D, BM, BN, POWER, DECAY, ALIBI, True, PREC)
        dk, dv, dc = _dkdv_steps(dk, dv, dc, k, v, cols, kmask, Q, DO, L, DL, C, slope, h, n0, diag_end, eos, eos,
                                 scale, s_qt, s_dot, N, H, D, BM, BN, POWER, DECAY, ALIBI, False, PREC)
        o = cols[:, None] * (H * D) + h * D + d[None, :]  # gradients are contiguous [N, H, D]
        tl.store(DK + o, (dk * scale).to(DK.dtype.element_ty), mask=kmask[:, None])
        tl.store(DV + o, dv.to(DV.dtype.element_ty), mask=kmask[:, None])
        if DECAY:
            tl.store(DC + h * N + cols, dc, mask=kmask)

    @triton.jit
    def _dq_steps(dq, dcr, q, do, rows, cr0, Lr, Dr, K, V, C, slope, h, m0, lo, hi, eos, scale, s_kt, s_vt, N,
                  D: tl.constexpr, BN: tl.constexpr, POWER: tl.constexpr, DECAY: tl.constexpr, ALIBI: tl.constexpr,
                  MASKED: tl.constexpr,
                  PREC: tl.constexpr):
        for n0 in range(lo, hi, BN):
            cols = n0 + tl.arange(0, BN)
            kmask = cols < eos
            if POWER != 0 and not MASKED:  # factored gate, reference r = the key block's last key
                r = n0 + BN - 1
                cr = cr0 - _cshift(C, slope, r, m0, h, N, DECAY, ALIBI)
                cc = -_cdiff(C, slope, cols, r, h, N, kmask, DECAY, ALIBI)
            else:
                cr = cr0
                cc = _cdiff(C, slope, cols, m0, h, N, kmask, DECAY, ALIBI)
            k = _rows(K, cols, s_kt, h, kmask, D)
            v = _rows(V, cols, s_vt, h, kmask, D)
            s = tl.dot(q, tl.trans(k), input_precision=PREC)
            p, g = _probs(s, Lr[:, None], cr[:, None], cc[None, :], scale, POWER, DECAY, ALIBI, MASKED)
            if MASKED:
                allowed = (cols[None, :] <= rows[:, None]) & kmask[None, :]
                p = tl.where(allowed, p, 0.0)
                g = tl.where(allowed, g, 0.0)
            dp = tl.dot(do, tl.trans(v), input_precision=PREC) - Dr[:, None]
            dq = tl.dot((g * dp).to(k.dtype), k, dq, input_precision=PREC)
            if DECAY:
                dcr += tl.sum(p * dp, 1)
        return dq, dcr

    @triton.jit
    def _dq_kernel(Q, K, V, C, SLOPES, DO, L, DL, DQ, DC, tab, cu, scale, T, NB, s_qt, s_kt, s_vt, s_dot, N,
                   H: tl.constexpr, D: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, POWER: tl.constexpr,
                   DECAY: tl.constexpr, ALIBI: tl.constexpr, VARLEN: tl.constexpr,
                   PREC: tl.constexpr):
        """One block of BM queries: dq from every key up to it (BM a multiple of BN), and the row part of dc,
        sum_j dz_ij. It is zero in exact arithmetic, but adding it makes dc consistent with the Delta_i the column part
        used (Delta comes from the rounded output), which cancels most of that rounding from the gate's gradient."""
        h, bos, eos, m0, rows, rmask, slope = _tile(tab, cu, T, NB, SLOPES, BM, VARLEN, False, ALIBI)
        d = tl.arange(0, D)
        q = _rows(Q, rows, s_qt, h, rmask, D)
        do = _rows(DO, rows, s_dot, h, rmask, D)
        Lr = tl.load(L + h * N + rows, mask=rmask, other=1.0)
        Dr = tl.load(DL + h * N + rows, mask=rmask, other=0)
        dq = tl.zeros([BM, D], dtype=tl.float32)
        dcr = tl.zeros([BM], dtype=tl.float32)
        cr0 = _cdiff(C, slope, rows, m0, h, N, rmask, DECAY, ALIBI)
        dq, dcr = _dq_steps(dq, dcr, q, do, rows, cr0, Lr, Dr, K, V, C, slope, h, m0, bos, m0, eos, scale, s_kt,
                            s_vt, N, D, BN, POWER, DECAY, ALIBI, False, PREC)
        dq, dcr = _dq_steps(dq, dcr, q, do, rows, cr0, Lr, Dr, K, V, C, slope, h, m0, m0, tl.minimum(m0 + BM, eos),
                            eos, scale, s_kt, s_vt, N, D, BN, POWER, DECAY, ALIBI, True, PREC)
        tl.store(DQ + rows[:, None] * (H * D) + h * D + d[None, :], (dq * scale).to(DQ.dtype.element_ty),
                 mask=rmask[:, None])
        if DECAY:
            tl.store(DC + h * N + rows, dcr, mask=rmask)


# Tile sizes: (held block, inner block, warps, stages) per kernel. The held block is shared by all three kernels (one
# block table for packed input); inner blocks must divide it. benchmarks/bench_attention.py sweeps them; these are the
# fastest on an H100 at D = 64 (the power path's dk/dv kernel holds more tiles at once and wants a smaller inner
# block).
CONFIG = {"block": 128, "fwd": (64, 4, 3), "dkdv": (32, 4, 3), "dkdv_power": (16, 4, 3), "dq": (64, 4, 3)}
INTERPRETER_CONFIG = {"block": 32, "fwd": (16, 4, 1), "dkdv": (16, 4, 1), "dkdv_power": (16, 4, 1),
                      "dq": (16, 4, 1)}


def _config():
    return INTERPRETER_CONFIG if os.environ.get("TRITON_INTERPRET") == "1" else CONFIG


def _precision(q):
    """fp32 inputs get fp32 products (tf32 would round them to 10 bits); 16-bit inputs are exact in any case."""
    return "ieee" if q.dtype == torch.float32 else "tf32"


class _DecayedAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, c, slopes, power, scale, cu_seqlens):
        B, T, H, D = q.shape
        cfg = _config()
        BLOCK = cfg["block"]
        flat = [t.reshape(B * T, H, D) for t in (q, k, v)]
        qf, kf, vf = [t if t.stride(-1) == 1 and t.stride(1) == D else t.contiguous() for t in flat]
        # per-token arrays (c, the row statistic, Delta, dc) are [H, N]: a block of tokens is contiguous
        cf = None if c is None else c.float().expand(B, T, H).reshape(B * T, H).t().contiguous()
        if cu_seqlens is not None:
            tab, cu = block_table(cu_seqlens, BLOCK, q.device)
            grid, NB = (tab.shape[0], H), 0
        else:
            tab = cu = qf
            NB = triton.cdiv(T, BLOCK)
            grid = (B * NB, H)
        sl = slopes.float().contiguous() if slopes is not None else qf
        o = torch.empty(B * T, H, D, device=q.device, dtype=q.dtype)
        L = torch.empty(H, B * T, device=q.device, dtype=torch.float32)
        bn, warps, stages = cfg["fwd"]
        _fwd_kernel[grid](qf, kf, vf, cf if cf is not None else qf, sl, o, L, tab, cu, scale, T, NB,
                          qf.stride(0), kf.stride(0), vf.stride(0), o.stride(0), B * T, H=H, D=D, BM=BLOCK, BN=bn,
                          POWER=power or 0, DECAY=c is not None, ALIBI=slopes is not None,
                          VARLEN=cu_seqlens is not None, PREC=_precision(q), num_warps=warps, num_stages=stages)
        ctx.save_for_backward(qf, kf, vf, o, cf, sl, L, tab, cu)
        ctx.meta = (B, T, H, D, power or 0, scale, NB, grid, c is not None, slopes is not None,
                    cu_seqlens is not None)
        return o.view(B, T, H, D)

    @staticmethod
    def backward(ctx, do):
        qf, kf, vf, o, cf, sl, L, tab, cu = ctx.saved_tensors
        B, T, H, D, power, scale, NB, grid, decay, alibi, varlen = ctx.meta
        cfg = _config()
        dof = do.reshape(B * T, H, D)
        dof = dof if dof.stride(-1) == 1 and dof.stride(1) == D else dof.contiguous()
        delta = (dof.float() * o.float()).sum(-1).t().contiguous()  # Delta_i = sum_j P_ij dP_ij = do_i . o_i
        dq, dk, dv = torch.empty_like(qf), torch.empty_like(kf), torch.empty_like(vf)
        dc = torch.empty(2, H, B * T, device=qf.device, dtype=torch.float32) if decay else L[None].expand(2, -1, -1)
        args = (cf if decay else qf, sl, dof, L, delta)
        common = dict(H=H, D=D, POWER=power, DECAY=decay, ALIBI=alibi, VARLEN=varlen, PREC=_precision(qf))
        bm, warps, stages = cfg["dkdv_power" if power else "dkdv"]
        _dkdv_kernel[grid](qf, kf, vf, *args, dk, dv, dc[0], tab, cu, scale, T, NB, qf.stride(0), kf.stride(0),
                           vf.stride(0), dof.stride(0), B * T, BM=bm, BN=cfg["block"], num_warps=warps,
                           num_stages=stages, **common)
        bn, warps, stages = cfg["dq"]
        _dq_kernel[grid](qf, kf, vf, *args, dq, dc[1], tab, cu, scale, T, NB, qf.stride(0), kf.stride(0), vf.stride(0),
                         dof.stride(0), B * T, BM=cfg["block"], BN=bn, num_warps=warps, num_stages=stages, **common)
        shape = (B, T, H, D)
        return (dq.view(shape), dk.view(shape), dv.view(shape), dc.sum(0).t().reshape(B, T, H) if decay else None,
                None, None, None, None)


@torch.compiler.disable
def _fused(q, k, v, c, slopes, power, scale, cu_seqlens):
    """The kernel call, kept out of torch.compile's graphs: Inductor would re-generate the launch and pass the
    scale as fp64 (a graph break per layer costs less than a kernel of its own)."""
    return _DecayedAttention.apply(q, k, v, c, slopes, power, scale, cu_seqlens)


def _triton_ok(q, k, bias, interpreter: bool = False):
    """The kernel applies: CUDA (or, when asked for explicitly, Triton's interpreter), Tq = Tk, no bias, D in
    16/32/64/128, a 16- or 32-bit float."""
    where = q.is_cuda or (interpreter and os.environ.get("TRITON_INTERPRET") == "1")
    return (triton is not None and where and q.shape[1] == k.shape[1] and bias is None
            and q.shape[-1] in (16, 32, 64, 128) and q.dtype in (torch.bfloat16, torch.float16, torch.float32))
