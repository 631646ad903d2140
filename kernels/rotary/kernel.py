"""The fused Triton kernel of the cumulative rotation, forward and backward (kernels/rotary/__init__.py says
how it works), with its autograd wrapper."""

from __future__ import annotations

import os

import torch

try:
    import triton
    import triton.language as tl
except ImportError:  # CPU-only installs: the reference
    triton = None

from ..varlen import chunk_table

if triton is not None:
    from ..varlen import chunk as _chunk

if triton is not None:
    @triton.jit
    def _look_back(flags, agg, inc, j, stop, step, cols, BD: tl.constexpr):
        """Decoupled look-back (Merrill & Garland): add up the published totals of chunks j, j+step, ... until one
        has published its inclusive sum (flag 2; flag 1 = only its own total so far, 0 = not yet)."""
        acc = tl.zeros([BD], dtype=tl.float32)
        while j != stop:
            f = tl.atomic_add(flags + j, 0, sem="acquire")
            if f == 2:
                acc += tl.load(inc + j * BD + cols, cache_modifier=".cg")
                j = stop
            elif f == 1:
                acc += tl.load(agg + j * BD + cols, cache_modifier=".cg")
                j += step
        return acc

    @triton.jit
    def _publish(flags, buf, j, value, flag, cols):
        tl.store(buf + j * value.shape[0] + cols, value)
        tl.debug_barrier()  # every lane's store lands before the flag says it is there
        tl.atomic_xchg(flags + j, flag, sem="release")

    @triton.jit
    def _increments(dphi, rows, cols, m, h, s_pt, s_ph, s_pd, CONST: tl.constexpr):
        if CONST:
            return tl.where(m, 1.0, 0.0)
        return tl.load(dphi + rows[:, None] * s_pt + h * s_ph + cols[None, :] * s_pd, mask=m, other=0).to(tl.float32)

    @triton.jit
    def _rotate_tile(x, out, rows, cols, m, h, s_t, s_h, o, cos, sin, D2: tl.constexpr):
        """out[o] = rot(x) of one [BT, D] tile given cos and sin of its angles; returns the input halves."""
        p = x + rows[:, None] * s_t + h * s_h + cols[None, :]
        x1 = tl.load(p, mask=m, other=0).to(tl.float32)
        x2 = tl.load(p + D2, mask=m, other=0).to(tl.float32)
        tl.store(out + o, (x1 * cos - x2 * sin).to(out.dtype.element_ty), mask=m)
        tl.store(out + o + D2, (x1 * sin + x2 * cos).to(out.dtype.element_ty), mask=m)
        return x1, x2

    @triton.jit
    def _rotation_fwd_kernel(q, k, dphi, theta, phi0, qo, ko, P, agg, inc, flags, chunk_tab, cu_seqlens, T, NT, NC,
                             s_qt, s_qh, s_kt, s_kh, s_pt, s_ph, s_pd, s_th,
                             H: tl.constexpr, D2: tl.constexpr, BT: tl.constexpr, BD: tl.constexpr,
                             VARLEN: tl.constexpr, CONST: tl.constexpr, HAS_PHI0: tl.constexpr):
        # chunks are taken in launch order (an atomic ticket), so every chunk a program waits on is already running
        ticket = tl.atomic_add(flags + H * NC, 1)
        h, c = ticket // NC, ticket % NC
        t0, eos, i, _ = _chunk(c, chunk_tab, cu_seqlens, T, NT, BT, VARLEN)
        rows, cols = t0 + tl.arange(0, BT), tl.arange(0, BD)
        mc = cols < D2
        m = (rows < eos)[:, None] & mc[None, :]
        inc_t = _increments(dphi, rows, cols, m, h, s_pt, s_ph, s_pd, CONST)
        total = tl.sum(inc_t, 0)
        j = h * NC + c  # this chunk's slot in the flag / partial-sum arrays
        if i == 0:
            prefix = tl.zeros([BD], dtype=tl.float32)
            if HAS_PHI0:
                prefix += tl.load(phi0 + ((c // NT) * H + h) * D2 + cols, mask=mc, other=0)
        else:
            _publish(flags, agg, j, total, 1, cols)
            prefix = _look_back(flags, agg, inc, j - 1, j - 1 - i, -1, cols, BD)
        _publish(flags, inc, j, prefix + total, 2, cols)
        tl.store(P + j * BD + cols, prefix)
        raw = tl.cumsum(inc_t, 0) + prefix[None, :]
        ang = raw * tl.load(theta + h * s_th + cols, mask=mc, other=0)[None, :]
        cos, sin = tl.cos(ang), tl.sin(ang)
        o = rows[:, None] * (H * 2 * D2) + h * (2 * D2) + cols[None, :]  # outputs are contiguous [N, H, D]
        _rotate_tile(q, qo, rows, cols, m, h, s_qt, s_qh, o, cos, sin, D2)
        _rotate_tile(k, ko, rows, cols, m, h, s_kt, s_kh, o, cos, sin, D2)

    @triton.jit
    def _rotation_bwd_kernel(gq, gk, yq, yk, dphi, theta, P, gqi, gki, gphi, dth, agg, inc, flags, chunk_tab,
                             cu_seqlens, T, NT, NC, s_gqt, s_gqh, s_gkt, s_gkh, s_pt, s_ph, s_pd, s_th,
                             H: tl.constexpr, D2: tl.constexpr, BT: tl.constexpr, BD: tl.constexpr,
                             VARLEN: tl.constexpr, CONST: tl.constexpr, NEED_DPHI: tl.constexpr,
                             BCAST: tl.constexpr, NEED_DTHETA: tl.constexpr):
        """gx = R(phi)^T g for q and k. dL/dphi_t = sum over q, k of g2 y1 - g1 y2 (y: the rotated outputs), and
        dL/ddphi_s = theta * sum_{t >= s} dL/dphi_t: a reverse cumulative sum, chunks taken last to first with the
        same look-back. dth gets each chunk's sum of Phi * dL/dphi (the temperature gradient)."""
        ticket = tl.atomic_add(flags + H * NC, 1)
        h, c = ticket // NC, NC - 1 - ticket % NC
        t0, eos, i, last = _chunk(c, chunk_tab, cu_seqlens, T, NT, BT, VARLEN)
        rows, cols = t0 + tl.arange(0, BT), tl.arange(0, BD)
        mc = cols < D2
        m = (rows < eos)[:, None] & mc[None, :]
        j = h * NC + c
        inc_t = _increments(dphi, rows, cols, m, h, s_pt, s_ph, s_pd, CONST)
        raw = tl.cumsum(inc_t, 0) + tl.load(P + j * BD + cols)[None, :]
        th = tl.load(theta + h * s_th + cols, mask=mc, other=0)[None, :]
        ang = raw * th
        cos, sin = tl.cos(ang), tl.sin(ang)
        o = rows[:, None] * (H * 2 * D2) + h * (2 * D2) + cols[None, :]  # y and the input gradients are contiguous
        g1, g2 = _rotate_tile(gq, gqi, rows, cols, m, h, s_gqt, s_gqh, o, cos, -sin, D2)  # R^T = R(-phi)
        da = (g2 * tl.load(yq + o, mask=m, other=0).to(tl.float32)
              - g1 * tl.load(yq + o + D2, mask=m, other=0).to(tl.float32))
        g1, g2 = _rotate_tile(gk, gki, rows, cols, m, h, s_gkt, s_gkh, o, cos, -sin, D2)
        da += (g2 * tl.load(yk + o, mask=m, other=0).to(tl.float32)
               - g1 * tl.load(yk + o + D2, mask=m, other=0).to(tl.float32))
        if NEED_DTHETA:
            tl.store(dth + j * BD + cols, tl.sum(da * raw, 0))
        if NEED_DPHI:
            dr = da * th
            total = tl.sum(dr, 0)
            if last:
                suffix = tl.zeros([BD], dtype=tl.float32)
            else:
                _publish(flags, agg, j, total, 1, cols)
                n_after = (eos - t0 + BT - 1) // BT - 1  # chunks after this one in the document
                suffix = _look_back(flags, agg, inc, j + 1, j + 1 + n_after, 1, cols, BD)
            _publish(flags, inc, j, suffix + total, 2, cols)
            g = tl.cumsum(dr, 0, reverse=True) + suffix[None, :]
            if BCAST:  # one increment per head, broadcast over channels: its gradient sums them
                tl.store(gphi + rows * H + h, tl.sum(g, 1), mask=rows < eos)
            else:
                tl.store(gphi + rows[:, None] * (H * D2) + h * D2 + cols[None, :], g.to(gphi.dtype.element_ty), mask=m)


def _flat(x, B, T, any_last_stride=False):
    """[B, T, ...] -> [B*T, ...] (a view when possible); the kernels index q, k and gradients with unit channel
    stride, increments with any (0 when one increment is broadcast over channels)."""
    x = x.reshape(B * T, *x.shape[2:])
    return x if any_last_stride or x.stride(-1) == 1 else x.contiguous()


def _block_t() -> int:
    """Tokens per chunk (the benchmark sweeps ROTARY_BLOCK_T)."""
    return int(os.environ.get("ROTARY_BLOCK_T", 32))  # fastest of 32 / 64 / 128 on an H100 (benchmarks/bench_rotary.py)


def _operands(dphi, theta, B, T, H, D2, placeholder):
    """The increments as a flat [B*T, H, D/2] view (placeholder pointer when constant) with their strides, and the
    temperatures as fp32 [H, D/2] with unit channel stride."""
    pf = placeholder if dphi is None else _flat(dphi.expand(B, T, H, D2), B, T, True)
    th = theta.float().expand(H, D2)
    return pf, ((0, 0, 0) if dphi is None else pf.stride()), (th if th.stride(1) == 1 else th.contiguous())


class _CumulativeRotation(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, dphi, theta, phi0, cu_seqlens):
        B, T, H, D = q.shape
        D2, dev = D // 2, q.device
        BT, BD = _block_t(), triton.next_power_of_2(D2)
        const, varlen = dphi is None, cu_seqlens is not None
        qf, kf = _flat(q, B, T), _flat(k, B, T)
        pf, s_p, th = _operands(dphi, theta, B, T, H, D2, qf)
        if varlen:
            tab, cu = chunk_table(cu_seqlens, BT, dev)
            NT, NC = 0, tab.shape[0]
        else:
            tab = cu = qf
            NT = triton.cdiv(T, BT)
            NC = B * NT
        p0 = None
        if phi0 is not None:  # a number (RoPE's position offset) or [B, H, D/2]
            p0 = (phi0.float().expand(B, H, D2).contiguous() if torch.is_tensor(phi0) else
                  torch.full((B, H, D2), float(phi0), device=dev, dtype=torch.float32))
        P = torch.empty(H * NC, BD, device=dev, dtype=torch.float32)  # each chunk's starting raw angle
        agg, inc = torch.empty_like(P), torch.empty_like(P)
        flags = torch.zeros(H * NC + 1, device=dev, dtype=torch.int32)  # + the ticket counter
        qo = torch.empty(B * T, H, D, device=dev, dtype=q.dtype)
        ko = torch.empty(B * T, H, D, device=dev, dtype=k.dtype)
        _rotation_fwd_kernel[(H * NC,)](qf, kf, pf, th, p0 if p0 is not None else qf, qo, ko, P, agg, inc, flags,
                                        tab, cu, T, NT, NC, qf.stride(0), qf.stride(1), kf.stride(0), kf.stride(1),
                                        *s_p, th.stride(0), H=H, D2=D2, BT=BT, BD=BD, VARLEN=varlen, CONST=const,
                                        HAS_PHI0=p0 is not None)
        final = None
        if not varlen:  # raw angle after the last token, for a decoding cache
            final = inc.view(H, B, NT, BD)[:, :, -1, :D2].permute(1, 0, 2)
            ctx.mark_non_differentiable(final)
        ctx.save_for_backward(qo, ko, dphi if not const else None, theta, P, tab, cu)
        ctx.meta = (B, T, H, D, BT, BD, NT, NC, const, varlen)
        return qo.view(B, T, H, D), ko.view(B, T, H, D), final

    @staticmethod
    def backward(ctx, gq, gk, _gfinal):
        qo, ko, dphi, theta, P, tab, cu = ctx.saved_tensors
        B, T, H, D, BT, BD, NT, NC, const, varlen = ctx.meta
        D2, dev = D // 2, qo.device
        need_dphi = not const and ctx.needs_input_grad[2]
        need_dtheta = ctx.needs_input_grad[3]
        bcast = need_dphi and dphi.shape[-1] == 1 and D2 > 1
        gqf, gkf = _flat(gq, B, T), _flat(gk, B, T)
        pf, s_p, th = _operands(dphi, theta, B, T, H, D2, qo)
        gqi, gki = torch.empty_like(qo), torch.empty_like(ko)
        gphi = (torch.empty(B * T, H, device=dev, dtype=torch.float32) if bcast else
                torch.empty(B * T, H, D2, device=dev, dtype=dphi.dtype) if need_dphi else qo)
        dth = torch.empty(H * NC, BD, device=dev, dtype=torch.float32) if need_dtheta else qo
        agg, inc = torch.empty_like(P), torch.empty_like(P)
        flags = torch.zeros(H * NC + 1, device=dev, dtype=torch.int32)
        _rotation_bwd_kernel[(H * NC,)](gqf, gkf, qo, ko, pf, th, P, gqi, gki, gphi, dth, agg, inc, flags, tab, cu,
                                        T, NT, NC, gqf.stride(0), gqf.stride(1), gkf.stride(0), gkf.stride(1),
                                        *s_p, th.stride(0), H=H, D2=D2, BT=BT, BD=BD, VARLEN=varlen, CONST=const,
                                        NEED_DPHI=need_dphi, BCAST=bcast, NEED_DTHETA=need_dtheta)
        g_dphi = g_theta = None
        if need_dphi:
            g_dphi = gphi.view(B, T, H, 1).to(dphi.dtype) if bcast else gphi.view(B, T, H, D2)
        if need_dtheta:
            g_theta = dth.view(H, NC, BD)[:, :, :D2].sum(1).to(theta.dtype)
            if theta.dim() == 1:
                g_theta = g_theta.sum(0)
        return gqi.view(B, T, H, D), gki.view(B, T, H, D), g_dphi, g_theta, None, None


# Outside Dynamo: under Triton 3.7.1 its analysis of these kernels fails and takes the whole compile with it. A
# compiled model calls them between two graphs, as it calls FLA's.
@torch.compiler.disable
def _triton_rotation(*args):
    return _CumulativeRotation.apply(*args)
