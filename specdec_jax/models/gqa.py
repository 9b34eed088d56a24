"""Replicated key/value heads: a grouped-query model split over more chips than it has kv heads.

Why: Llama-3.1 70B has 64 query heads over 8 key/value heads; Chen et al. ran their 70B target
model-parallel over 16 TPU v4 chips. Heads split over the model axes, and 8 kv heads split
over at most 8 chips (`sharding.validate`). vLLM, MaxText and tpu-inference all answer this the
same way: each kv head is held by the r chips whose query heads read it. Here that is a change
of the model itself, exact by construction: `replicate_kv_heads` repeats every kv head r times
(adjacent copies) in the key/value projections, so the model has kv_heads * r heads of which
each group of G / r query heads reads one copy; the attention reads the same keys and values
as before, so the logits are the same numbers. The cache grows r-fold in total but not per chip
(each chip holds the one head its queries read, as with kv_heads chips), and the k/v kernels,
which are 2 * kv / (2 * kv + 2 * H) of the attention weights (1/9 for 70B), are what is copied.
"""
from __future__ import annotations

import math
from typing import Any

import jax.numpy as jnp
import numpy as np
from flax import traverse_util

from specdec_jax.models.model_config import ModelConfig

_KV = ("key", "value")


def replication_for(config: ModelConfig, chips: int) -> int:
  """The smallest r such that `chips` divides kv_heads * r: chips / gcd(kv_heads, chips). It
  divides the group size G whenever `chips` divides the query heads (chips | kv * G), so every
  query head still reads one copy of its own kv head. 1 where the kv heads already split, or
  where the query heads do not (`sharding.validate` then names them)."""
  kv, heads = config.kv_heads, config.num_heads
  if chips <= 1 or kv % chips == 0 or heads % chips:
    return 1
  return chips // math.gcd(kv, chips)


def replicated_config(config: ModelConfig, r: int) -> ModelConfig:
  """The config of the model with every kv head repeated r times."""
  if r == 1:
    return config
  groups = config.num_heads // config.kv_heads
  if r < 1 or groups % r:
    raise ValueError(f"kv head replication r={r} must divide the query heads per kv head "
                     f"({config.num_heads} / {config.kv_heads} = {groups})")
  return config.replace(num_kv_heads=config.kv_heads * r)


def _repeat_heads(x, kv: int, r: int):
  """[..., kv * K] -> [..., kv * r * K], each head's K columns repeated r times in place."""
  xp = np if isinstance(x, np.ndarray) else jnp
  lead, width = x.shape[:-1], x.shape[-1]
  heads = x.reshape(*lead, kv, width // kv)
  return xp.repeat(heads, r, axis=len(lead)).reshape(*lead, kv * r * (width // kv))


def replicate_kv_heads(config: ModelConfig, params: Any, r: int) -> tuple[ModelConfig, Any]:
  """(config, params) with every self-attention key/value head repeated r times (module
  docstring). Decoder-only models with grouped-query attention; unrolled or scanned layers;
  numpy or jax leaves (a jax leaf keeps being a jax array, placed where `sharding.place` puts
  it next)."""
  if r == 1:
    return config, params
  if config.is_encoder_decoder:
    raise ValueError("kv head replication is for decoder-only grouped-query models")
  new_config = replicated_config(config, r)
  flat = traverse_util.flatten_dict(params, sep="/")
  out = {}
  for path, x in flat.items():
    parts = path.split("/")
    if len(parts) >= 3 and parts[-3] == "self_attention" and parts[-2] in _KV:
      x = _repeat_heads(x, config.kv_heads, r)
    out[path] = x
  return new_config, traverse_util.unflatten_dict(out, sep="/")
