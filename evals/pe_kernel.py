"""Pictures of each positional scheme's effective relative-position kernel: the duality made visible.

For the last query t of a sequence and a key at distance n = t - j, one layer's position-dependent part is one of

    log-weight   A(t, j) = (c_t - c_j) + b_tj       c = cumsum(log a): the forget gate of a recurrence (GLA, Mamba2,
                                                    RetNet, Gated DeltaNet, FoX, PaTH-FoX) or ALiBi's -m_h per step;
                                                    b: T5 / Transformer-XL biases. exp(A) multiplies token j's
                                                    weight (softmax) or its contribution to the state (recurrence).
    rotation     R(t, j) = mean_i cos(phi_t,i - phi_j,i)     the factor q.k picks up for a q and k that agree in
                                                    content, averaged over channel pairs (RoPE, Selective RoPE).

read off a trained or fresh model on real tokens (data-dependent gates and angles vary with the input; the curves
are averaged over the batch). A scheme with neither (NoPE, linear attention) draws the flat line A = 0.
Householder products (PaTH, DeltaNet) transform keys rather than weight them and are not drawn.
"""

from __future__ import annotations

import math

import torch

from duality.common.plots import save_figure
from duality.kernels.attention import log_weight_bias


@torch.no_grad()
def relative_kernel(model, idx: torch.Tensor, layer: int = 0) -> dict[str, torch.Tensor]:
    """{'log-weight': [H, T], 'rotation': [H, T]} as functions of the distance n = 0..T-1 from the last query."""
    block = model.blocks[layer]
    mixer, pe = block.mixer, block.mixer.pe
    seen = {}

    def keep(name, value):  # a pre-hook that returns None leaves the call unchanged
        seen.setdefault(name, value)

    hooks = [mixer.register_forward_pre_hook(lambda m, a: keep("x", a[0]))]
    spied = [h for h in ("rotate", "scores") if pe is not None]  # the q, k (and x) the mixer hands its scheme

    def spy(hook):
        method = getattr(pe, hook)

        def call(q, k, *args, **kw):
            keep("qk", (q, k, (args[0] if args else kw.get("x")) if hook == "rotate" else None))
            return method(q, k, *args, **kw)
        return call
    for h in spied:
        setattr(pe, h, spy(h))
    try:
        model(idx)
    finally:
        for h in hooks:
            h.remove()
        for h in spied:
            delattr(pe, h)  # the class's method again
    x = seen["x"]
    B, T = x.shape[:2]
    out = {}
    log_weight = torch.zeros(B, T, mixer.n_heads, dtype=torch.float64, device=x.device)  # A(T-1, j), [B, j, H]
    gate = mixer.log_gate(x)
    if gate is not None:
        c = torch.cumsum(gate.double().expand(B, T, -1), 1)
        log_weight += c[:, -1:] - c
    if pe is not None and pe.kind == "score":
        q, k, _ = seen["qk"]
        a = log_weight_bias(T, T, device=x.device, dtype=torch.float64,
                            **{n: t.double() for n, t in pe.scores(q, k).items()})
        log_weight += a[:, :, -1].expand(B, mixer.n_heads, T).transpose(1, 2)  # row t = T - 1
    if gate is not None or pe is None or pe.kind == "score":  # rotary-only layers have no log-weight
        out["log-weight"] = log_weight.mean(0).T.flip(-1)  # [H, n]
    if pe is not None and pe.kind in ("rotary", "vo_rotary"):
        if hasattr(pe, "increments"):  # Selective RoPE: phi = Theta * cumsum(dphi(q, x))
            q, _, xin = seen["qk"]
            phi = pe.theta.double() * torch.cumsum(pe.increments(q, xin).double(), 1)  # [B, T, H, D/2]
        else:
            phi = pe.angles(T, 0, pe.dims.rotary_dim, x.device).double()[None].expand(B, T, mixer.n_heads, -1)
        cos = torch.cos(phi[:, -1:] - phi).mean(-1)  # [B, j, H]
        out["rotation"] = cos.mean(0).T.flip(-1)
    return out


def plot_kernels(kernels: dict[str, dict[str, torch.Tensor]], path, title: str = "") -> object:
    """kernels: model label -> relative_kernel(). One panel per (model, kind): thin lines per head, thick mean."""
    panels = [(label, kind, k) for label, ks in kernels.items() for kind, k in ks.items()]
    ncols = min(4, len(panels))
    nrows = math.ceil(len(panels) / ncols)

    def draw(axes):
        for ax, (label, kind, k) in zip(axes, panels):
            n = torch.arange(k.shape[-1])
            for h in range(k.shape[0]):
                ax.plot(n, k[h].cpu(), lw=0.8, alpha=0.6)
            ax.plot(n, k.mean(0).cpu(), color="black", lw=2, label="mean over heads")
            ax.set_title(f"{label}: {kind}", fontsize=9)
            ax.set_xlabel("distance t - j (tokens)")
            ax.set_ylabel("c_t - c_j + b_tj" if kind == "log-weight" else "mean cos(phi_t - phi_j)")
            if kind == "rotation":
                ax.set_ylim(-1.05, 1.05)
            ax.grid(alpha=0.3)
        for ax in axes[len(panels):]:
            ax.axis("off")
        if title:
            axes[0].figure.suptitle(title, fontsize=10)

    return save_figure(path, draw, figsize=(3.6 * ncols, 2.9 * nrows), ncols=ncols, nrows=nrows)
