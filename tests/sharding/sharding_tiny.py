"""Tiny models, prompts, mesh layouts and cached compiled decodes for the sharding tests.

The tiny presets get 8 heads (target head_dim 4, draft head_dim 2) so every layout divides them,
and EOS moves to an id these random models rarely pick, so outputs run long enough to compare
many tokens. Importing this module configures nothing (the multi-process worker forces its own
device count before importing it). `Runs` compiles each (layout, temperature) program once per
session; the equivalence and HLO tests share them, because compiles are the cost here.
"""
import dataclasses
import functools

import jax
import numpy as np

from specdec_jax import sharding as sh
from specdec_jax.decoding.decoder import Decoder, Params
from specdec_jax.decoding.sampling import SamplingConfig
from specdec_jax.decoding.speculative import Chain
from specdec_jax.models.model_config import get_preset
from specdec_jax.models.model import Model

GAMMA, MAX_LEN, BATCH = 3, 12, 8
# (data, model_outer, model_inner). Target model-parallel = outer * inner; draft = inner.
LAYOUTS = {
    "dp1_mp8": (1, 1, 8),
    "dp2_mp4": (2, 1, 4),
    "dp8_mp1": (8, 1, 1),
    "dp2_target4_draft2": (2, 2, 2),  # the draft on fewer chips than the target
}


@functools.lru_cache(maxsize=None)
def tiny_models(kind="t5", seed=0):
  """(target, params, draft, params); cached: every `Model.init` call is a fresh compile.

  One encoder and one decoder layer each: compiles are what these tests pay for, and one layer
  exercises every sharded weight kind (attention, MLP, embedding, logits) as well as two do.
  """
  layers = dict(num_encoder_layers=1, num_decoder_layers=1) if kind == "t5" else {}
  target = Model(get_preset(f"{kind}_test_target", num_heads=8, head_dim=4, eos_id=63, **layers))
  draft = Model(get_preset(f"{kind}_test_draft", num_heads=8, head_dim=2, eos_id=63, **layers))
  k1, k2 = jax.random.split(jax.random.key(seed))
  return target, target.init(k1), draft, draft.init(k2)


def tiny_inputs(batch=BATCH, seed=0):
  rng = np.random.default_rng(seed)
  x = rng.integers(3, 63, (batch, 6)).astype(np.int32)
  x[:, -1] = 1
  x[1, 3:] = 0  # ragged prompts: right padding
  x[5, 2:] = 0
  return x


def sampling_for(temperature):
  return SamplingConfig(temperature=temperature)


class Runs:
  """Lazily compiled and cached decodes: the unsharded reference and each sharded layout."""

  def __init__(self):
    self.models = tiny_models()
    self.inputs = tiny_inputs()
    self.rng = jax.random.key(1)
    self._ref, self._sharded = {}, {}

  def reference(self, temperature):
    if temperature not in self._ref:
      t, tp, d, dp = self.models
      decoder = Decoder(t, d, Chain(GAMMA), sampling_for(temperature), max_decode_len=MAX_LEN)
      self._ref[temperature] = jax.device_get(decoder.generate(Params(tp, dp), self.inputs,
                                                               self.rng))
    return self._ref[temperature]

  def sharded(self, layout, temperature):
    """A `Sharded` run of the layout: the loop program compiled once, run on a prefilled state."""
    key = (layout, temperature)
    if key not in self._sharded:
      t, tp, d, dp = self.models
      placed = sh.shard_models(t, tp, d, dp, mesh_config=sh.MeshConfig(*LAYOUTS[layout]),
                               batch_size=BATCH)
      decoder = Decoder(placed.target, placed.draft, Chain(GAMMA), sampling_for(temperature),
                        max_decode_len=MAX_LEN, mesh=placed.mesh)
      params = Params(placed.target_params, placed.draft_params)
      state, lowered = decoder.lower(params, self.inputs, self.rng)
      compiled = lowered.compile()
      leaves = jax.tree_util.tree_flatten_with_path(state)[0]
      out, _ = compiled(params, state, None)
      donated = {jax.tree_util.keystr(p) for p, x in leaves if x.is_deleted()}
      kept = {jax.tree_util.keystr(p) for p, x in leaves if not x.is_deleted()}
      self._sharded[key] = Sharded(placed, compiled, out, jax.device_get(out), donated, kept)
    return self._sharded[key]


@dataclasses.dataclass
class Sharded:
  placed: sh.Placed
  compiled: object      # the compiled loop program (`jax.stages.Compiled`)
  out: object           # its DecodeResult, on device
  host: object          # the same on host
  donated: set          # state leaves (key paths) the loop call consumed
  kept: set             # state leaves it left alive (loop-invariant: encoder cross K/V)
