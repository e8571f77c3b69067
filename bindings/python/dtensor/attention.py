"""Fused scaled-dot-product attention over DTensors: ``dtensor.nn.scaled_dot_product_attention``
(PyTorch's ``torch.nn.functional.scaled_dot_product_attention`` without mask and dropout), the
C library's ``dt_attention``."""

import math as _math

import numpy as np

from . import errors
from ._nn import nn as _nn
from ._ops import _apply, _operands, _symbolic_aware

__all__ = ["scaled_dot_product_attention"]

_FLOATING = ("float16", "bfloat16", "float32", "float64")


def scaled_dot_product_attention(query, key, value, attn_mask=None, dropout_p=0.0,
                                 is_causal=False, scale=None, enable_gqa=False):
    """softmax(scale * query @ key^T) @ value, PyTorch's ``F.scaled_dot_product_attention``.

    ``query``, ``key`` and ``value`` are DTensors (or variables, or arrays next to one) of one
    shape and one floating dtype (float32, float64; bfloat16 and float16 compute in float32
    and round once), ``[B, H, T, D]`` as PyTorch lays them out: batch, heads, sequence, head
    features. Any rank >= 2 works the same way, ``[..., T, D]``: every axis before the last two
    indexes an independent slice. ``is_causal``: query ``i`` sees keys ``0..i`` only.
    ``scale``: a positive number, ``1 / sqrt(D)`` when None. ``attn_mask``, ``dropout_p`` and
    ``enable_gqa`` exist for PyTorch's signature; a mask, a non-zero dropout or grouped
    queries raise ``errors.UnimplementedError``.

    How it maps onto ``dt_attention``: the operands go to the C op as they are (no transpose:
    ``dt_attention`` takes ``[..., T, E]`` with the leading axes independent, so B and H are
    its leading axes and D its E). It is fused and tiled as FlashAttention (blocks of queries
    and keys with an online softmax: no ``[T, T]`` scores are held, memory grows with T).
    The batch and head axes may be sharded over any mesh dimensions, evenly or not: each
    device computes its own ``[b, h, T, D]`` slices with no collective, and the result keeps
    that layout. A sequence or feature axis split over the mesh is gathered first (each query
    needs all of its keys); ``key`` and ``value`` are brought to ``query``'s layout.

    Differentiable: under a ``GradientTape`` (or inside ``dtensor.function``) the gradient is
    ``dt_attention``'s fused backward kernel, which recomputes each query block's softmax
    statistics (FlashAttention's backward pass) and yields dq, dk and dv in the operands'
    layout.

    Errors, before any op runs (``errors.InvalidArgumentError``, a ValueError, naming the
    values): operands on different meshes, of different shapes or dtypes, of rank below 2, of a
    non-floating dtype, or a scale that is not a positive finite number."""
    name = "scaled_dot_product_attention"
    if attn_mask is not None:
        raise errors.UnimplementedError(f"{name}: attn_mask is not supported (use is_causal "
                                        f"for the causal mask)")
    if dropout_p:
        raise errors.UnimplementedError(f"{name}: dropout_p={dropout_p!r}: dropout is not "
                                        f"supported (0.0 only)")
    if enable_gqa:
        raise errors.UnimplementedError(f"{name}: enable_gqa is not supported")
    if scale is not None:
        if isinstance(scale, bool) or not isinstance(scale, (int, float, np.integer,
                                                             np.floating)):
            raise errors.InvalidArgumentError(f"{name}: scale must be a number or None, got "
                                              f"{type(scale).__name__}")
        if not (_math.isfinite(float(scale)) and float(scale) > 0):
            raise errors.InvalidArgumentError(f"{name}: scale {scale!r}: expected a positive "
                                              f"finite number (or None for 1/sqrt(D))")
    q, k, v = _operands([query, key, value], name)
    for n, t in zip("kv", (k, v)):
        if t.layout.mesh is not q.layout.mesh:
            raise errors.InvalidArgumentError(f"{name}: {n} is on {t.layout.mesh}, query on "
                                              f"{q.layout.mesh}: expected one mesh")
    for n, t in zip("qkv", (q, k, v)):
        if str(t.dtype) not in _FLOATING:
            raise errors.InvalidArgumentError(f"{name}: {n} is {t.dtype}: expected one of "
                                              f"{', '.join(_FLOATING)}")
    if len(q.shape) < 2:
        raise errors.InvalidArgumentError(f"{name}: query has shape {list(q.shape)}: expected "
                                          f"rank >= 2, [B, H, T, D] (or [..., T, D])")
    for n, t in zip("kv", (k, v)):
        if tuple(t.shape) != tuple(q.shape) or t.dtype != q.dtype:
            raise errors.InvalidArgumentError(
                f"{name}: {n} is {t.dtype}{list(t.shape)}, query {q.dtype}{list(q.shape)}: "
                f"expected one shape and dtype (key and value sequence lengths and value "
                f"features equal to query's)")
    return _apply("attention", [q, k, v], int(bool(is_causal)),
                  float(scale) if scale is not None else 0.0)


_nn.scaled_dot_product_attention = _symbolic_aware(scaled_dot_product_attention)
