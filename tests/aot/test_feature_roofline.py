"""A feature-level draft's step on the roofline reads exactly the weights its step uses.

Why: c (`aot.feature_roofline`) is bytes read per draft step over a target step's; counting the
draft as its block (`block_config()`) misses the input projection, and for a block narrower than
the target the head projection and the target-width head. The count must equal the draft's own
parameters less the token embedding (a row per token), the fusion (once per iteration) and T5's
cross-attention key / value (applied at prefill).
"""
import json
import math
import os

import jax
import pytest

from specdec_jax.aot import feature_roofline as fr
from specdec_jax.aot import roofline
from specdec_jax.models.model_config import get_preset
from specdec_jax.models.feature_draft import FeatureDraft
from specdec_jax.models.feature_draft_config import FeatureDraftConfig

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
NOT_READ_PER_STEP = ("['token_embedder']", "['fuse']", "['encoder_decoder_attention']['key']",
                     "['encoder_decoder_attention']['value']")


@pytest.mark.parametrize("kind,overrides", [("t5", {}),  # the target's width (EAGLE-3's)
                                            ("decoder", dict(emb_dim=16, num_heads=2,
                                                             mlp_dim=32))])  # narrower
def test_step_reads_every_parameter_but_embedding_fusion_and_cross_kv(kind, overrides):
  cfg = FeatureDraftConfig.for_target(get_preset(f"{kind}_test_target"), **overrides)
  leaves = jax.tree_util.tree_flatten_with_path(FeatureDraft(cfg).param_shapes())[0]
  read = sum(math.prod(x.shape) for path, x in leaves
             if not any(n in jax.tree_util.keystr(path) for n in NOT_READ_PER_STEP))
  p = fr.placement(cfg, batch=1, prompt_len=4, cache_len=8, chips=1)
  assert p.params_read == read
  fused = [x for path, x in leaves if "['fuse']" in jax.tree_util.keystr(path)]
  assert fr.fuse_params(cfg) == math.prod(fused[0].shape)


def test_c_beside_the_token_drafts_of_a_recorded_layout():
  # The v4-8 mesh record: T5-small's c is the record's own; the XXL feature draft reads about
  # what T5-large reads per step (one 4096-wide layer and the 32128 x 4096 head).
  with open(os.path.join(ROOT, "docs/results/roofline_tpu_v4_mesh.json")) as f:
    layout = roofline.layout_of_record(json.load(f))
  cfg = FeatureDraftConfig.for_target(get_preset("t5_1_1_xxl"), dtype="bfloat16")
  table = fr.c_table(layout, "feature", cfg, gamma=7, chips=2)["drafts"]
  assert table["t5_1_1_small"]["c"] == layout.c("t5_1_1_small")
  large = table["t5_1_1_large"]
  assert table["feature"]["c"] > table["t5_1_1_base"]["c"]
  assert abs(table["feature"]["params_read"] / large["params_read"] - 1) < 0.01
  assert 0 < table["feature"]["fuse_c"] < table["feature"]["c"]
