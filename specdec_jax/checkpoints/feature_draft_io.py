"""A feature-level draft's checkpoint: Orbax arrays, its config and the target it belongs to.

DIR/feature_draft_config.json   FeatureDraftConfig.to_json() (what makes DIR a feature draft)
DIR/params/                     Orbax (OCDBT) arrays: the draft's own weights only
DIR/paired_target.json          the target's name, config and a digest of ALL its params

Why the whole target in the digest: the draft reads the target's hidden states of every decoder
layer it names and uses its embedding and head; another target of the same shape runs without
error and only drafts noise, so a run refuses it (`check_target`).

Why the target's pieces are not stored: they are the paired target's own arrays
(`FeatureDraft.frozen_names`, never trained), a draft is only ever used with that target, and
they are most of the bytes (the T5 zoo target's embedding and head: 8 of a draft's 11 MB in
bfloat16). `load(path, target_params)` copies them in from the target it is given; an export
written before this (pieces included) loads as it is.
"""
from __future__ import annotations

import hashlib
import json
import os
from typing import Any, Mapping

import jax
import numpy as np
import orbax.checkpoint as ocp

from specdec_jax.models.feature_draft import FeatureDraft
from specdec_jax.models.feature_draft_config import FeatureDraftConfig

CONFIG_FILE = "feature_draft_config.json"
RECORD_FILE = "paired_target.json"
PARAMS_DIR = "params"


def is_feature_draft(path: str) -> bool:
  return os.path.isfile(os.path.join(str(path), CONFIG_FILE))


def target_digest(params: Mapping[str, Any]) -> str:
  """16 hex digits over every target parameter (paths and bfloat16 values)."""
  h = hashlib.sha256()
  leaves = jax.tree_util.tree_flatten_with_path(params)[0]
  for path, leaf in sorted(leaves, key=lambda kv: jax.tree_util.keystr(kv[0])):
    x = np.asarray(jax.device_get(leaf)).astype(jax.numpy.bfloat16)
    h.update(f"{jax.tree_util.keystr(path)}:{x.shape}\0".encode())
    h.update(np.ascontiguousarray(x).tobytes())
  return h.hexdigest()[:16]


def save(path: str, draft: FeatureDraft, params, *, target_name: str, target_params,
         dtype=None) -> str:
  """Writes the draft's own arrays (cast to `dtype` if given; the target's pieces left out), its
  config and its pairing record."""
  path = os.path.abspath(path)
  os.makedirs(path, exist_ok=True)
  own = {k: v for k, v in params.items() if k not in draft.frozen_names()}
  arrays = jax.tree.map(lambda x: np.asarray(jax.device_get(x)), own)
  if dtype is not None:
    arrays = jax.tree.map(lambda x: x.astype(dtype), arrays)
  with ocp.PyTreeCheckpointer() as ckptr:
    ckptr.save(os.path.join(path, PARAMS_DIR), arrays, force=True)
  record = {"target": target_name, "target_digest": target_digest(target_params)}
  with open(os.path.join(path, RECORD_FILE), "w", encoding="utf-8") as f:
    json.dump(record, f, indent=1, sort_keys=True)
  with open(os.path.join(path, CONFIG_FILE), "w", encoding="utf-8") as f:  # last: complete
    f.write(draft.config.to_json())
  return path


def read_draft(path: str) -> FeatureDraft:
  """The draft a checkpoint holds, from its config alone (no weights read)."""
  with open(os.path.join(os.path.abspath(path), CONFIG_FILE), encoding="utf-8") as f:
    return FeatureDraft(FeatureDraftConfig.from_json(f.read()))


def load(path: str, target_params=None) -> tuple[FeatureDraft, Any]:
  """(FeatureDraft, float32 params as numpy arrays), the target's embedding and head copied in
  from `target_params` (its paired target's: `check_target` tells). Without them, an export
  that does not carry those pieces is refused by name."""
  path = os.path.abspath(path)
  draft = read_draft(path)
  with ocp.PyTreeCheckpointer() as ckptr:
    params = dict(ckptr.restore(os.path.join(path, PARAMS_DIR)))
  missing = [k for k in draft.frozen_names() if k not in params]
  if missing and target_params is None:
    raise ValueError(f"feature draft {path!r} stores its own weights only; its {missing} are "
                     "its target's: load(path, target_params) with the paired target's params")
  if missing:
    params = draft.with_target_pieces(params, target_params)
  return draft, jax.tree.map(lambda x: np.asarray(x, np.float32), params)


def check_target(path: str, target_name: str, target_params) -> None:
  """Raises a ValueError unless `target_params` are the ones the draft was trained on."""
  with open(os.path.join(os.path.abspath(path), RECORD_FILE), encoding="utf-8") as f:
    record = json.load(f)
  digest = target_digest(target_params)
  if digest != record["target_digest"]:
    raise ValueError(f"feature draft {path!r} was trained on the states of {record['target']!r} "
                     f"(digest {record['target_digest']}), but the target {target_name!r} has "
                     f"other weights (digest {digest}): pair it with its own target")
