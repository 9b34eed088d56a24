r"""c of a feature-level draft with the target's full head and with a 3,072-token head, beside the
shipped shared draft's (3,072), in one process: lone `extend` steps as the run times them
(`runner.costs.measure`: T = 1, batch 1, caches sized for 64 tokens), on one en-de prompt.

  python experiments/feature_draft_costs.py runs/train/t5_feature_draft/export

The feature draft's directory needs the ranking beside it for the 3,072 row
(docs/feature_draft.md). Prints one JSON line per draft and head.
"""
import dataclasses
import json
import sys

from specdec_jax.checkpoints import loader
from specdec_jax.data import tasks
from specdec_jax.models import packed
from specdec_jax.runner import costs as costs_lib, drafts as drafts_lib
from specdec_jax.runner.run_config import DraftSpec, checkpoint_kind
from specdec_jax.runner.inputs import Prompts

target_path = "specdec_jax/assets/zoo/t5_target"
target, tp = loader.load_model(target_path)
data = tasks.load("translate_en_de", "valid", None, max_input_length=128)
data = dataclasses.replace(data, examples=data.examples[:1])
prompts = Prompts.tokenized(data, target, 128)
drafts = {}
for path, k in [("specdec_jax/assets/zoo/t5_shared_draft", 3072), (sys.argv[1], 0),
                (sys.argv[1], 3072)]:
  spec = DraftSpec(checkpoint_kind(path), path)
  settings = drafts_lib.DraftSettings(head_vocab=k, task="translate_en_de")
  d, p = drafts_lib.load_draft(spec, target, tp, settings, target_name=target_path)
  drafts[(spec.name, k)] = packed.for_backend(d, p)
target, tp = packed.for_backend(target, tp)
costs = costs_lib.measure(target, tp, drafts, prompts.batch([0]), [1, 3, 5], repeats=10,
                          max_decode_len=64)
for k, c in costs.items():
  print(json.dumps({"draft": k[0], "head": k[1] or 8192, "c": round(c.c, 3),
                    "draft_ms": round(c.draft_ms, 3), "target_ms": round(c.target_ms, 3),
                    "v3": round(c.v[3], 2), "v5": round(c.v[5], 2)}))
