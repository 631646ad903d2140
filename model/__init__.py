"""Build a GPT from the three config groups that describe it: backbone (mixer), pe (positional scheme), model (size).

`build_model` checks the whole combination before allocating anything, and raises ConfigError naming the valid
choices: an unknown backbone or scheme, a scheme the backbone cannot use, an unknown option, an impossible shape.
"""

from __future__ import annotations

from duality.common.errors import ConfigError
from duality.kernels.linear_ce import IMPLS as LOSS_IMPLS

from .core.context import Dims
from .core.layers import MLP_IMPLS
from .core.options import defaults, register_schemas
from .gpt import GPT, NORMS, Cache, ModelConfig
from .mixers import REGISTRY as MIXERS
from .mixers.base import Mixer
from .pe import REGISTRY as SCHEMES
from .pe import build_pe
from .pe.base import check_options

__all__ = ["GPT", "Cache", "ModelConfig", "ConfigError", "build_model", "check_model_config", "refusal",
           "valid_schemes", "with_defaults"]

# conf/backbone/<name>.yaml and conf/pe/<name>.yaml extend these (model/core/options.py)
register_schemas("backbone", MIXERS)
register_schemas("pe", SCHEMES)


def with_defaults(group: str, cfg: dict) -> dict:
    """A backbone, pe or model config with every option its class has (a checkpoint written when the yaml listed
    fewer)."""
    if group == "model":
        fields = ModelConfig.__dataclass_fields__.values()
        return {**{f.name: f.default for f in fields if f.name != "vocab_size"}, **cfg}
    registry = {"backbone": MIXERS, "pe": SCHEMES}[group]
    cls = registry.get(cfg.get("name"))
    return {**defaults(cls), **cfg} if cls is not None else dict(cfg)


def valid_schemes(backbone: str) -> list[str]:
    kinds = MIXERS[backbone].pe_kinds
    return sorted(n for n, cls in SCHEMES.items() if cls.kind in kinds)


def _plain(cfg) -> dict:
    try:
        from omegaconf import OmegaConf
        if OmegaConf.is_config(cfg):
            return OmegaConf.to_container(cfg, resolve=True)
    except ImportError:
        pass
    return dict(cfg)


def check_model_config(backbone: dict, pe: dict, model: dict) -> None:
    bname, pname = backbone.get("name"), pe.get("name")
    if bname not in MIXERS:
        raise ConfigError(f"unknown backbone={bname!r}; valid choices: {sorted(MIXERS)}")
    if pname not in SCHEMES:
        raise ConfigError(f"unknown positional scheme pe={pname!r}; valid choices: {sorted(SCHEMES)}")
    mixer, scheme = MIXERS[bname], SCHEMES[pname]
    if scheme.kind not in mixer.pe_kinds:
        raise ConfigError(
            f"pe={pname} is a {scheme.kind} scheme, which backbone={bname} cannot use (it accepts "
            f"{'/'.join(mixer.pe_kinds)} schemes); valid pe for backbone={bname}: {valid_schemes(bname)}")
    check_options(mixer, {k: v for k, v in backbone.items() if k != "name"}, f"backbone={bname}")
    check_options(scheme, {k: v for k, v in pe.items() if k != "name"}, f"pe={pname}")
    d, h = model.get("d_model"), model.get("n_heads")
    if not (isinstance(d, int) and isinstance(h, int) and d > 0 and h > 0):
        raise ConfigError(f"model.d_model and model.n_heads must be positive integers, got {d} and {h}")
    if d % h:
        divisors = [x for x in range(1, min(d, 64) + 1) if d % x == 0]
        raise ConfigError(f"model.n_heads={h} does not divide model.d_model={d}; n_heads could be one of {divisors}")
    if scheme.kind == "rotary" and (d // h) % 2:
        raise ConfigError(f"pe={pname} rotates channel pairs: head_dim = d_model/n_heads = {d // h} must be even")
    if model.get("head", "lm") not in ("auto", "lm", "compress"):
        raise ConfigError(f"model.head={model['head']!r}; valid choices: ['auto', 'lm', 'compress']")
    unknown = set(model) - set(ModelConfig.__dataclass_fields__) - {"name"}
    if unknown:
        raise ConfigError(f"model: unknown option(s) {sorted(unknown)}; valid: "
                          f"{sorted(ModelConfig.__dataclass_fields__)}")
    if model.get("norm", "rms") not in NORMS:
        raise ConfigError(f"model.norm={model['norm']!r}; valid choices: {sorted(NORMS)}")
    std = model.get("conv_init_std")
    if std is not None and not (isinstance(std, (int, float)) and std > 0):
        raise ConfigError(f"model.conv_init_std={std!r}: null (unit-gain init) or a standard deviation > 0, e.g. 0.02")
    p = model.get("embed_dropout", 0.0)
    if not (isinstance(p, (int, float)) and 0 <= p < 1):
        raise ConfigError(f"model.embed_dropout={p!r} must be in [0, 1)")
    if model.get("sparse_loss") and not model.get("fused_loss"):
        raise ConfigError("model.sparse_loss=true computes the chunked loss at the scored positions only: it needs "
                          "model.fused_loss=true")
    if model.get("mlp_impl", "inductor") not in MLP_IMPLS:
        raise ConfigError(f"model.mlp_impl={model['mlp_impl']!r}; valid choices: {list(MLP_IMPLS)}")
    impl = model.get("fused_loss_impl", "auto")
    if impl not in LOSS_IMPLS:
        raise ConfigError(f"model.fused_loss_impl={impl!r}; valid choices: {list(LOSS_IMPLS)}")
    pattern = model.get("layer_mixers")
    if pattern is not None:
        bad = [m for m in pattern if m != "backbone" and m not in MIXERS]
        if not pattern or bad:
            raise ConfigError(f"model.layer_mixers={list(pattern)}: {bad or 'empty'} not valid; each entry is "
                              f"'backbone' or one of {sorted(MIXERS)}")


def refusal(cfg) -> str | None:
    """Why a job's config names a model this repo cannot build (None: it can, or the config names none): the sweep
    launcher's precheck (conf/hydra/launcher/gpus.yaml), so a refused backbone x scheme pair of a sweep fails at once
    with the message its own process would print, and takes no GPU place."""
    if not all(k in cfg for k in ("backbone", "pe", "model")):
        return None
    try:
        check_model_config(*(_plain(cfg[k]) for k in ("backbone", "pe", "model")))
    except ConfigError as e:
        return str(e)
    except Exception:  # e.g. an interpolation only the job can resolve: its own process decides
        pass
    return None


def build_model(backbone, pe, model, vocab_size: int) -> GPT:
    backbone, pe, model = _plain(backbone), _plain(pe), _plain(model)
    check_model_config(backbone, pe, model)
    if model.get("head") == "auto":  # train.py resolves it from the data; text needs the LM head
        model = {**model, "head": "lm"}
    cfg = ModelConfig(vocab_size=vocab_size, **{k: v for k, v in model.items() if k not in ("name", "vocab_size")})
    mixer_cls = MIXERS[backbone["name"]]
    options = {k: v for k, v in backbone.items() if k != "name"}
    # everything a scheme is shaped by, known before any mixer exists
    dims = Dims(cfg.d_model, cfg.n_heads, cfg.d_model // cfg.n_heads, cfg.seq_len,
                qk_dim=mixer_cls.qk_dim(cfg.d_model, cfg.n_heads, **options), softmax=mixer_cls.softmax)
    relative = SCHEMES[pe["name"]].kind not in ("none", "absolute")  # built per layer, owned by the mixer
    pattern = cfg.layer_mixers or ["backbone"]
    mixers: list[Mixer] = []
    for i in range(cfg.n_layer):
        name = pattern[i % len(pattern)]
        if name == "backbone":
            mixers.append(mixer_cls(cfg.d_model, cfg.n_heads, build_pe(pe, dims) if relative else None, **options))
        else:  # another family in a hybrid stack: its own defaults, no positional scheme
            mixers.append(MIXERS[name](cfg.d_model, cfg.n_heads))
    abs_pe = build_pe(pe, dims) if SCHEMES[pe["name"]].kind == "absolute" else None
    return GPT(cfg, mixers, abs_pe)
