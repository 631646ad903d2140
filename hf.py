"""The transformers face of every checkpoint: `import duality.hf` registers model_type "duality" with AutoConfig and
AutoModelForCausalLM (as `import fla` does for FLA's models), so an exported folder loads, generates and is scored as
any Hugging Face causal LM:

    python eval.py ckpt=RUN mode=export out=exports/gla-rope        # config.json, model.safetensors, tokenizer
    AutoModelForCausalLM.from_pretrained("exports/gla-rope").generate(ids, max_new_tokens=50, do_sample=True)
    python -m duality.evals.harness --model hf --model_args pretrained=exports/gla-rope --tasks lambada_openai

    DualityConfig        the Hydra config's backbone, pe and model groups as they are, and the vocabulary size
    DualityForCausalLM   PreTrainedModel + GenerationMixin around the repo's own GPT (model/gpt.py): no second
                         implementation of any mixer; labels -> the shifted next-token loss
    DualityCache         transformers' Cache holding the trunk's decoding state (model.gpt.Cache: the tokens seen,
                         each layer's KV cache / recurrent state / convolution inputs / running angle)

Not in `duality/__init__.py`: importing transformers' PreTrainedModel costs ~4 s, which every training process
would pay.
"""

from __future__ import annotations

import copy
import json
from contextlib import nullcontext
from pathlib import Path

import torch
import torch.nn.functional as F
from transformers import AutoConfig, AutoModelForCausalLM, GenerationMixin, PretrainedConfig, PreTrainedModel
from transformers.cache_utils import Cache as HFCache
from transformers.generation import StoppingCriteria, StoppingCriteriaList
from transformers.modeling_outputs import CausalLMOutputWithPast

from duality.common.errors import ConfigError
from duality.common.io import atomic_dir
from duality.model import build_model, with_defaults
from duality.model.gpt import Cache, varying_shapes
from duality.trainer.checkpoint import EXPORT_MARKER, load_weights, read_checkpoint

# The output field generate reads the cache back from: `cache` from transformers 5.24, `past_key_values` before.
_CACHE_FIELD = "cache" if "cache" in CausalLMOutputWithPast.__dataclass_fields__ else "past_key_values"


class DualityConfig(PretrainedConfig):
    model_type = "duality"
    keys_to_ignore_at_inference = ["past_key_values", "cache"]

    def __init__(self, backbone: dict | None = None, pe: dict | None = None, model: dict | None = None,
                 vocab_size: int = 256, autocast: str | None = "bfloat16", **kwargs):
        """autocast: the dtype a CUDA forward of float32 weights runs in (training's mixed precision); None: the
        weights' own dtype."""
        self.backbone = dict(backbone or {"name": "transformer"})
        self.pe = dict(pe or {"name": "rope"})
        self.model = {k: v for k, v in dict(model or {}).items() if k != "vocab_size"}
        self.vocab_size = vocab_size
        self.autocast = autocast
        # what tools read from any causal LM config (lm-eval's max_length, generation's defaults)
        self.max_position_embeddings = self.model.get("seq_len", 256)
        self.hidden_size = self.model.get("d_model", 256)
        self.num_hidden_layers = self.model.get("n_layer", 4)
        self.num_attention_heads = self.model.get("n_heads", 4)
        kwargs["tie_word_embeddings"] = bool(self.model.get("tie_embeddings", False))
        super().__init__(**kwargs)


class DualityCache(HFCache):
    """The trunk's own decoding state behind transformers' Cache interface; `generate` passes it from call to call.
    reorder_cache (beam search) selects rows of every tensor it holds."""
    is_compileable = False

    def __init__(self, n_layer: int):
        super().__init__(layers=[])  # no transformers layer objects: the state lives in the trunk's LayerStates
        self.state = Cache(n_layer)

    def __len__(self):
        return self.state.n_layer

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return self.state.offset

    def reorder_cache(self, beam_idx: torch.LongTensor):
        def pick(x):
            if isinstance(x, torch.Tensor):
                return x.index_select(0, beam_idx.to(x.device))
            if isinstance(x, (tuple, list)):
                return type(x)(pick(v) for v in x)
            if isinstance(x, dict):
                return {k: pick(v) for k, v in x.items()}
            return x
        for layer in self.state.layers:
            for name, value in vars(layer).items():
                setattr(layer, name, pick(value))


class DualityForCausalLM(PreTrainedModel, GenerationMixin):
    config_class = DualityConfig
    base_model_prefix = "model"
    main_input_name = "input_ids"
    _no_split_modules = ["Block"]
    _supports_cache_class = True

    def __init__(self, config: DualityConfig):
        super().__init__(config)
        # Built on the CPU even inside from_pretrained's meta-device context: the non-persistent buffers (RoPE's
        # cos/sin, ALiBi's slopes, ...) are computed here and never saved, and transformers replaces them by empty
        # tensors while loading; _init_weights puts these values back.
        with torch.device("cpu"):
            self.model = build_model(config.backbone, config.pe, config.model, config.vocab_size)
        self._buffers_at_init = {f"{p}.{n}" if p else n: b.clone() for p, m in self.model.named_modules()
                                 for n, b in m._buffers.items() if b is not None and n in m._non_persistent_buffers_set}
        if config.tie_word_embeddings:
            self._tied_weights_keys = {"model.lm_head.weight": "model.wte.weight"}
        self.post_init()

    @classmethod
    def _supports_default_dynamic_cache(cls) -> bool:
        return False  # the trunk's layers keep their own state (DualityCache), not transformers' key/value lists

    def _init_weights(self, module):
        """Parameters come initialised from the trunk (GPT.reset_parameters) or loaded; only the non-persistent
        buffers that loading emptied are restored."""
        prefix = next((p for p, m in self.model.named_modules() if m is module), None)
        if prefix is None:
            return
        for name, buf in list(module.named_buffers(recurse=False)):
            key = f"{prefix}.{name}" if prefix else name
            if key in self._buffers_at_init:
                module._buffers[name] = self._buffers_at_init[key].to(buf.device)

    def get_input_embeddings(self):
        return self.model.wte

    def set_input_embeddings(self, value):
        self.model.wte = value

    def get_output_embeddings(self):
        return self.model.lm_head

    def set_output_embeddings(self, value):
        self.model.lm_head = value

    def forward(self, input_ids: torch.LongTensor, attention_mask: torch.Tensor | None = None,
                past_key_values: DualityCache | None = None, labels: torch.LongTensor | None = None,
                use_cache: bool | None = None, cache: DualityCache | None = None,
                **kwargs) -> CausalLMOutputWithPast:
        """use_cache=True (what `generate` passes) starts or continues a DualityCache; without it nothing is kept.
        attention_mask may only mark right padding: the trunk is causal, so tokens after a row's end never change
        its logits, while a recurrent state cannot skip tokens before it (left padding; `generate` handles it).
        The cache comes as `past_key_values` (transformers < 5.24) or `cache` (5.24 renamed it) and goes back
        under the name the installed version reads."""
        past_key_values = cache if past_key_values is None else past_key_values
        if attention_mask is not None and attention_mask.ndim == 2 and not bool(attention_mask.all()):
            right_padded = bool((attention_mask.cummin(-1).values == attention_mask).all())
            if past_key_values is not None or use_cache or not right_padded:
                raise ValueError("attention_mask: only right padding is supported in a single forward (scoring); "
                                 "a recurrent state cannot skip pad tokens. Left-padded prompts go to `generate`, "
                                 "which decodes each prompt length on its own")
        if use_cache and past_key_values is None:
            past_key_values = DualityCache(len(self.model.blocks))
        cache = past_key_values.state if past_key_values is not None else None
        with self._precision(), (varying_shapes() if not self.training else nullcontext()):
            logits, _ = self.model(input_ids, cache=cache)
        loss = None
        if labels is not None:  # transformers' convention: labels are the inputs, shifted here; -100 is ignored
            loss = F.cross_entropy(logits[:, :-1].flatten(0, 1).float(), labels[:, 1:].flatten().to(logits.device),
                                   ignore_index=-100)
        return CausalLMOutputWithPast(loss=loss, logits=logits, **{_CACHE_FIELD: past_key_values})

    @torch.no_grad()
    def hidden_states(self, input_ids: torch.LongTensor) -> torch.Tensor:
        """[B, T] -> the head's input [B, T, d_model] (the trunk's output after the final norm), in the forward's
        precision; logits_at maps any of its rows to logits. For scorers that need the logits at a few positions:
        the head at every position is the largest matmul of a forward and its [B, T, V] output the largest tensor."""
        if self.model.decoder is not None:
            raise ValueError("model.head=compress decodes a whole sequence from one state; it has no per-token head")
        with self._precision(), varying_shapes():
            return self.model.norm(self.model.trunk(input_ids))

    @torch.no_grad()
    def logits_at(self, hidden: torch.Tensor) -> torch.Tensor:
        """Rows of hidden_states [..., d_model] -> their logits [..., V], as forward gives them."""
        with self._precision():
            return self.model.lm_head(hidden)

    def _precision(self):
        dtype = getattr(torch, self.config.autocast) if self.config.autocast else None
        if dtype is None or self.device.type != "cuda" or self.dtype != torch.float32:
            return nullcontext()
        return torch.autocast("cuda", dtype=dtype)

    @torch.no_grad()
    def generate(self, input_ids: torch.LongTensor | None = None, attention_mask: torch.Tensor | None = None,
                 **kwargs):
        """transformers' generate. A left-padded batch (prompts of several lengths, as tokenizers pad for
        decoder-only models) decodes as one batch per prompt length, each without padding, and comes back with the
        same left padding, new tokens padded on the right: a recurrent state cannot skip pad tokens. Stopping
        criteria see the whole padded batch, as they would have (lm-eval's track each row of it)."""
        if self.model.decoder is not None:
            raise ValueError("model.head=compress decodes a whole sequence from one state; it does not generate")
        if attention_mask is None or input_ids is None or bool(attention_mask.all()):
            return self._generate(input_ids=input_ids, attention_mask=attention_mask, **kwargs)
        flipped = attention_mask.flip(-1)
        if not bool((flipped.cummin(-1).values == flipped).all()):
            raise ValueError("attention_mask: generate takes left padding only (tokenizer.padding_side = 'left', "
                             "the exported tokenizer's default)")
        if kwargs.get("return_dict_in_generate") or kwargs.get("num_return_sequences", 1) != 1:
            raise ValueError("a left-padded batch generates as one batch per prompt length; return_dict_in_generate "
                             "and num_return_sequences > 1 need prompts of one length")
        pad = kwargs.get("pad_token_id", self.generation_config.pad_token_id)
        pad = self.generation_config.eos_token_id if pad is None else pad
        pad = pad[0] if isinstance(pad, (list, tuple)) else pad
        W, lengths = input_ids.shape[1], attention_mask.sum(-1).tolist()
        stopping, max_length = kwargs.pop("stopping_criteria", None), kwargs.pop("max_length", None)
        rows: list = [None] * len(lengths)
        for n in sorted(set(lengths)):
            idx = [i for i, m in enumerate(lengths) if m == n]
            group = dict(kwargs)
            if max_length is not None:
                group["max_length"] = max_length - (W - n)
            if stopping is not None:
                group["stopping_criteria"] = StoppingCriteriaList([_InPaddedBatch(stopping, input_ids, idx, n)])
            prompt = input_ids[idx, W - n:]
            out = self._generate(input_ids=prompt, attention_mask=torch.ones_like(prompt), **group)
            for i, row in zip(idx, out):
                rows[i] = torch.cat([input_ids[i, :W - n], row])
        width = max(len(r) for r in rows)
        return torch.stack([F.pad(r, (0, width - len(r)), value=pad) for r in rows])

    def _generate(self, input_ids=None, attention_mask=None, fast_decoding: bool = True,
                  cuda_graphs: bool | None = None, compile_step: bool = False, **kwargs):
        """Prompts of one length: the repo's decoding loop (model/decode.py: fixed buffers, a CUDA graph a step,
        sampling on the GPU) when the request needs only what it does (greedy or sampling with temperature, top-k,
        top-p; end-of-sequence ids, max_length / max_new_tokens, stopping criteria), else transformers' generate
        (beam search, other logits processors, scores in the output, streamers). fast_decoding=False always takes
        transformers'; cuda_graphs=False decodes eagerly (None: graphs on a CUDA device); compile_step=True compiles the
        decoding step with torch.compile first (fewer kernels a step; a compilation per new batch and length)."""
        if input_ids is None or not fast_decoding:
            return super().generate(input_ids=input_ids, attention_mask=attention_mask, **kwargs)
        # transformers' own merging of the model's generation_config, the global defaults and the kwargs (a private
        # method, present through transformers 4.4x-5.x), so both loops read the same settings
        config, rest = self._prepare_generation_config(kwargs.pop("generation_config", None), **kwargs)
        stopping = rest.pop("stopping_criteria", None)
        rest.pop("use_cache", None)
        P = input_ids.shape[1]
        n = config.max_new_tokens if config.max_new_tokens is not None else (config.max_length or 20) - P
        unusual = [k for k, default in FAST_PATH_DEFAULTS.items() if getattr(config, k, None) not in (None, default)]
        if unusual or any(v is not None for v in rest.values()) or n <= 0:
            return super().generate(input_ids=input_ids, attention_mask=attention_mask, generation_config=config,
                                    stopping_criteria=stopping, **rest)
        from duality.model.decode import generate
        sampling = bool(config.do_sample)
        stop = None
        if stopping:
            criteria = StoppingCriteriaList(stopping if isinstance(stopping, list) else [stopping])
            stop = lambda ids, scores: criteria(ids, scores)  # noqa: E731
        return generate(self.model, input_ids, n, temperature=(config.temperature or 1.0) if sampling else 0.0,
                        top_k=config.top_k if sampling else None, top_p=config.top_p if sampling else None,
                        eos_token_id=config.eos_token_id, pad_token_id=config.pad_token_id, stop=stop,
                        cuda_graphs=cuda_graphs, compile=compile_step, precision=self._precision)

    @classmethod
    def from_checkpoint(cls, path, device="cpu") -> tuple["DualityForCausalLM", object]:
        """A training checkpoint or an export (anything eval.py's ckpt= accepts) as (this model in eval mode, its
        tokenizer as a transformers PreTrainedTokenizerFast)."""
        return cls.from_checkpoint_dict(*read_checkpoint(path), device)

    @classmethod
    def from_checkpoint_dict(cls, ckpt_path, ckpt: dict, device="cpu") -> tuple["DualityForCausalLM", object]:
        from duality.data import Tokenizer
        cfg, tok = ckpt["config"], Tokenizer.from_dict(ckpt["tokenizer"])
        config = DualityConfig(backbone=with_defaults("backbone", cfg["backbone"]), pe=with_defaults("pe", cfg["pe"]),
                               model={k: v for k, v in cfg["model"].items() if k != "name"},
                               vocab_size=ckpt["vocab_size"], bos_token_id=tok.eot_id, eos_token_id=tok.eot_id,
                               pad_token_id=tok.eot_id)
        model = cls(config)
        load_weights(model.model, ckpt["model"], ckpt_path)
        return model.to(device).eval(), hf_tokenizer(tok)


# generation settings the repo's decoding loop does not implement, at the values that switch them off: any other value
# sends generate to transformers' own loop (DualityForCausalLM._generate)
FAST_PATH_DEFAULTS = {
    "num_beams": 1, "num_return_sequences": 1, "min_length": 0, "min_new_tokens": 0, "repetition_penalty": 1.0,
    "encoder_repetition_penalty": 1.0, "no_repeat_ngram_size": 0, "bad_words_ids": None, "force_words_ids": None,
    "typical_p": 1.0, "epsilon_cutoff": 0.0, "eta_cutoff": 0.0, "min_p": None, "top_h": None,
    "forced_bos_token_id": None, "forced_eos_token_id": None, "suppress_tokens": None, "begin_suppress_tokens": None,
    "sequence_bias": None, "guidance_scale": 1.0, "renormalize_logits": False, "remove_invalid_values": False,
    "exponential_decay_length_penalty": None, "watermarking_config": None, "output_scores": False,
    "output_logits": False, "return_dict_in_generate": False, "stop_strings": None, "max_time": None,
    "penalty_alpha": None, "dola_layers": None, "prompt_lookup_num_tokens": None, "constraints": None,
    "diversity_penalty": 0.0, "num_beam_groups": 1, "token_healing": False, "output_attentions": False,
    "output_hidden_states": False,
}


class _InPaddedBatch(StoppingCriteria):
    """Stopping criteria written for the whole left-padded batch, asked about one prompt-length group of it: each
    row outside the group is shown as a copy of the group's first row, so "every row is done" means every row of
    the group. A fresh copy per group: criteria may keep per-row state."""

    def __init__(self, criteria, padded: torch.Tensor, rows: list[int], n: int):
        criteria = StoppingCriteriaList(criteria if isinstance(criteria, list) else [criteria])
        self.criteria, self.padded, self.n = copy.deepcopy(criteria), padded, n
        at = {r: j for j, r in enumerate(rows)}
        self.pick = torch.tensor([at.get(i, 0) for i in range(len(padded))])
        self.rows = torch.tensor(rows)

    def __call__(self, input_ids, scores, **kwargs):
        pick = self.pick.to(input_ids.device)
        frame = torch.cat([self.padded[self.rows].to(input_ids.device), input_ids[:, self.n:]], 1)
        done = self.criteria(frame[pick], scores[pick] if scores is not None else None, **kwargs)
        if isinstance(done, torch.Tensor) and done.ndim:
            return done[self.rows.to(done.device)]
        return torch.full((len(input_ids),), bool(done), device=input_ids.device)


def hf_tokenizer(tok):
    """The repo's tokenizer (data/tokenizer.py) as a transformers PreTrainedTokenizerFast with the same ids."""
    from transformers import PreTrainedTokenizerFast
    fast = tok.to_hf()
    eot = fast.id_to_token(tok.eot_id)
    return PreTrainedTokenizerFast(tokenizer_object=fast, eos_token=eot, bos_token=eot, pad_token=eot,
                                   padding_side="left", model_max_length=int(1e30), clean_up_tokenization_spaces=False)


def export(ckpt, out, dtype: str = "float32") -> Path:
    """Write `ckpt` as a transformers model folder at `out` (config.json, model.safetensors, generation_config.json,
    tokenizer.json, tokenizer_config.json), whole or not at all (common/io.py's atomic_dir): an earlier export at
    `out` is replaced only once the new one is complete."""
    if dtype not in ("float32", "bfloat16", "float16"):
        raise ConfigError(f"export dtype={dtype!r}; valid choices: ['float32', 'bfloat16', 'float16']")
    out = Path(out)
    if out.exists() and not is_export(out):
        what = "a file" if not out.is_dir() else f"holds {', '.join(sorted(p.name for p in out.iterdir())[:5])}"
        raise ConfigError(f"out={out} is not an earlier export of this repo ({what}; no {EXPORT_MARKER}): export "
                          "replaces only its own folders; choose another out")
    if out.is_dir() and (added := sorted(p.name for p in out.iterdir() if not _written_by_export(p.name))):
        raise ConfigError(f"out={out} is an earlier export that now also holds {', '.join(added[:5])}, which "
                          "export did not write and would delete with the folder: move them, or choose another out")
    source_path, source = read_checkpoint(ckpt)
    model, tokenizer = DualityForCausalLM.from_checkpoint_dict(source_path, source)
    model.to(getattr(torch, dtype))
    # auto_map: `from_pretrained(folder, trust_remote_code=True)` (lm_eval --model hf, any script) finds the classes
    # through the folder's REMOTE_CODE module, which imports them from the installed package
    model.config.auto_map = {"AutoConfig": f"{REMOTE_MODULE}.DualityConfig",
                             "AutoModelForCausalLM": f"{REMOTE_MODULE}.DualityForCausalLM"}
    with atomic_dir(out) as tmp:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        (tmp / f"{REMOTE_MODULE}.py").write_text(REMOTE_CODE)
        # what eval.py needs to read the folder back as it reads the run (trainer/checkpoint.py: read_export)
        (tmp / EXPORT_MARKER).write_text(json.dumps({"checkpoint": str(ckpt), "dtype": dtype, "step": source["step"],
                                                     "tokenizer": source["tokenizer"],
                                                     "config": source["config"]}) + "\n")
    return out


REMOTE_MODULE = "duality_remote"
# The folder's code for trust_remote_code: the classes stay in the package (one copy of the model code); without it,
# an ImportError that says what to install. transformers checks a remote module's imports before running it, except
# those in a try block, so the message below is what a user sees.
REMOTE_CODE = '''"""The code of a model exported by duality (sequence mixers x positional schemes): the classes
come from the installed `duality` package, which `from_pretrained(..., trust_remote_code=True)` imports here."""
try:
    from duality.hf import DualityConfig, DualityForCausalLM  # noqa: F401
except ImportError as e:
    raise ImportError("this model is a duality export and needs the duality package: `pip install -e .` in a "
                      "checkout of the duality repository (docs/install.md), then load it again") from e
'''




def is_export(folder: Path) -> bool:
    """An empty folder, or one that export wrote: its marker, or (exports written before the marker) a config.json
    of this model type and nothing but the files export writes."""
    if not folder.is_dir():
        return False
    names = {p.name for p in folder.iterdir()}
    if not names or EXPORT_MARKER in names:
        return True
    try:
        typed = json.loads((folder / "config.json").read_text()).get("model_type") == DualityConfig.model_type
    except (OSError, ValueError):
        return False
    return typed and all(_written_by_export(n) for n in names)


def _written_by_export(name: str) -> bool:
    """A file name that export (transformers' save_pretrained, the tokenizer, the marker) writes into its folder."""
    import fnmatch
    return name in {"config.json", "model.safetensors", "generation_config.json", "tokenizer.json", EXPORT_MARKER,
                    "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja",
                    "model.safetensors.index.json", f"{REMOTE_MODULE}.py"} or fnmatch.fnmatch(name,
                                                                                 "model-*-of-*.safetensors")


AutoConfig.register(DualityConfig.model_type, DualityConfig, exist_ok=True)
AutoModelForCausalLM.register(DualityConfig, DualityForCausalLM, exist_ok=True)
