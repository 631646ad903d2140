"""The seam between token mixers (model/mixers/) and positional schemes (model/pe/), which import this package and
never each other: the dimensions a scheme is built for (Dims), the context every forward receives (Context: the
decoding offset, packed-document boundaries and the layer's typed state), and the layers both sides use."""

from .context import Context, Dims, LayerState

__all__ = ["Context", "Dims", "LayerState"]
