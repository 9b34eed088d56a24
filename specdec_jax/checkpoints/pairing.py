"""Which target a shared-encoder draft belongs to: recorded in its checkpoint, checked at load.

Why: a shared-encoder draft (`ModelConfig.source_dim`) learned to read ONE encoder's states. Paired
with another target of the same width (a retrained target, another model of that emb_dim) it runs
without any error and drafts noise: alpha collapses, which looks like a bad draft rather than a
wrong configuration. So the trainer's export writes `paired_target.json` beside
`model_config.json`: the target's name, its config and a digest of the weights the draft depends
on (the token embedding and the encoder), and a run pairs the draft only with a target whose
digest is the same.

The digest is over the weights rounded to bfloat16, so a target stored in bfloat16 (the zoo) and
run in float32, or stored in float32 and run in bfloat16 (TPU), reads the same.
"""
from __future__ import annotations

import hashlib
import json
import os
from typing import Any, Mapping

import jax
import numpy as np

RECORD_FILE = "paired_target.json"
_ENCODER_SIDE = ("token_embedder", "encoder")


def encoder_digest(params: Mapping[str, Any]) -> str:
  """16 hex digits over the target's token embedding and encoder (paths and bfloat16 values)."""
  missing = [k for k in _ENCODER_SIDE if k not in params]
  if missing:
    raise ValueError(f"the target's params have no {', '.join(missing)}: only a T5 model with its "
                     "own encoder can be a shared-encoder draft's target")
  h = hashlib.sha256()
  for name in _ENCODER_SIDE:
    leaves = jax.tree_util.tree_flatten_with_path(params[name])[0]
    for path, leaf in sorted(leaves, key=lambda kv: jax.tree_util.keystr(kv[0])):
      x = np.asarray(jax.device_get(leaf)).astype(jax.numpy.bfloat16)
      h.update(f"{name}{jax.tree_util.keystr(path)}:{x.shape}\0".encode())
      h.update(np.ascontiguousarray(x).tobytes())
  return h.hexdigest()[:16]


def write(draft_dir: str, *, target_name: str, target_config, target_params) -> dict:
  """Writes the record into an exported draft's directory; returns it."""
  record = {"target": target_name,
            "target_config": {k: v for k, v in target_config.to_dict().items()
                              if k not in ("dtype", "scan_layers")},
            "encoder_digest": encoder_digest(target_params)}
  record = json.loads(json.dumps(record))  # what `read` gives back (tuples become lists)
  with open(os.path.join(draft_dir, RECORD_FILE), "w", encoding="utf-8") as f:
    json.dump(record, f, indent=1, sort_keys=True)
  return record


def read(draft_dir: str) -> dict | None:
  path = os.path.join(draft_dir, RECORD_FILE)
  if not os.path.isfile(path):
    return None
  with open(path, encoding="utf-8") as f:
    return json.load(f)


def check(draft_dir: str, *, draft_name: str, target_name: str, target_params) -> None:
  """Raises a ValueError naming both models unless the draft in `draft_dir` was trained on this
  target's encoder (a checkpoint without a record is refused too: nothing says which encoder)."""
  record = read(draft_dir)
  if record is None:
    raise ValueError(
        f"draft {draft_name!r} is a shared-encoder draft but its checkpoint has no {RECORD_FILE}: "
        "nothing says which target's encoder it reads. Export it with the trainer "
        "(TrainConfig.teacher names its target), or use a draft with its own encoder")
  digest = encoder_digest(target_params)
  if digest != record["encoder_digest"]:
    raise ValueError(
        f"draft {draft_name!r} is a shared-encoder draft trained on the encoder of "
        f"{record['target']!r} (encoder digest {record['encoder_digest']}), but the target "
        f"{target_name!r} has another encoder (digest {digest}): it would draft from states it "
        "never saw. Pair it with its own target, or train a draft for this one")
