r"""A feature draft's agreement at each drafting depth: teacher-forced (training's view) beside the
decode loop's (inference's), on the same sequences.

Why: a feature draft drafts its first token from the target's states and every later one from
its own output features; training-time test trains `ttt_steps` such rolled-out steps and no more.
When the loop keeps far fewer deep drafts than training's agreement suggests, either a depth was
never trained or training and the loop disagree on coordinates (`models/feature_draft.py`'s
docstring); this tells the two apart. On sequences the draft trained on (a distill_data task:
the target's own greedy replies), it prints:
- teacher-forced top-1 agreement with the target over the reply positions at rolled-out depth
  d = 1 .. --depths (depth 1: the target's states; depth d: the draft's own features d - 1
  times, `feature_trainer.rollout_layout`, as training computes them);
- the loop's P(the d-th draft kept | the d - 1 before it kept), d = 1 .. --gamma, greedy,
  decoding the same prompts (a T = 0 chain keeps a draft iff it is the target's argmax);
- whether the loop's output is the stored reply (it must be: the target's greedy output).

The loop's depth-1 figure sits below the teacher-forced one even when both are right: a call
starts after a rejection, at positions harder than the average one. A depth that was never
trained shows as a collapse (SmolLM2's code draft after one rolled-out step: 0.51 teacher-forced
at depth 2, 0.49 in the loop, then 0.09 at depth 3).

  python experiments/feature_draft_depth.py --target=smollm2-135m-instruct \
      --feature_draft=runs/train/smollm2_code_feature_draft/export \
      --task=runs/seqkd/smollm2_code/code_complete --target_len=640 --prompt_format=chat \
      --rows=8 --gamma=4 --output=/tmp/depth.json
"""
from __future__ import annotations

import argparse
import json
import os

import jax
import jax.numpy as jnp
import numpy as np

from specdec_jax.checkpoints import feature_draft_io as fd_ckpt
from specdec_jax.checkpoints import loader
from specdec_jax.data import tasks as tasks_lib
from specdec_jax.decoding import draft_schemes
from specdec_jax.decoding.decoder import Decoder, Params
from specdec_jax.decoding.sampling import SamplingConfig
from specdec_jax.training import data as data_lib
from specdec_jax.training import feature_step as fstep


def teacher_forced(draft, params, target, target_params, batch, reply_BxT, depths: int):
  """Top-1 agreement with the target over `reply_BxT` positions at rolled-out depths 1..depths."""
  enc, dec = data_lib.model_inputs(batch)
  _, logits_BxTxV, hidden = fstep.target_features(target, draft.feature_layers, target_params,
                                                batch)
  tokens_BxT, teacher_BxT = dec[:, 1:], jnp.argmax(logits_BxTxV[:, 1:], -1)
  t = tokens_BxT.shape[1]
  g_parts, out = [draft.fuse(params, hidden[:, :-1])], []
  for a in range(depths):
    layout = fstep.rollout_layout(t, a + 1) if a else (None, None)
    feats = draft.features(params, enc, jnp.tile(tokens_BxT, (1, a + 1)),
                           jnp.concatenate(g_parts, axis=1), offsets=layout[0],
                           visible=layout[1])[:, a * t:]
    agree_BxT = np.asarray(jnp.argmax(draft.logits(params, feats), -1) == teacher_BxT)
    at_BxT = reply_BxT & (np.arange(t) >= a)[None, :]
    out.append(round(float((agree_BxT & at_BxT).sum() / max(at_BxT.sum(), 1)), 4))
    g_parts.append(jnp.pad(feats[:, :-1], ((0, 0), (1, 0), (0, 0))))
  return out


def loop_depths(draft, params, target, target_params, prompts_NxP, gamma: int, max_new: int):
  """(P(d-th draft kept | d - 1 kept) for d = 1..gamma, tokens per call, output tokens)."""
  scheme, drafter = draft_schemes.plan(draft, gamma)
  decoder = Decoder(target, draft, scheme, SamplingConfig(temperature=0.0),
                    max_decode_len=max_new, drafter=drafter)
  result = decoder.generate(Params(target_params, jax.device_put(params)), prompts_NxP,
                            jax.random.key(0))
  c = jax.device_get(result.counters)
  calls = float(np.sum(c.target_calls_B))
  at_least = np.concatenate([[calls], np.sum(c.accepts_per_position_BxG, axis=0)])
  conditional = [round(float(at_least[d] / at_least[d - 1]), 4) if at_least[d - 1] else None
                 for d in range(1, gamma + 1)]
  return conditional, float(np.sum(c.emitted_B)) / calls, np.asarray(result.tokens_BxN)


def main():
  ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  ap.add_argument("--target", required=True)
  ap.add_argument("--feature_draft", required=True, help="its export directory")
  ap.add_argument("--task", required=True, help="a decoder-only training task (distill_data's)")
  ap.add_argument("--target_len", type=int, default=640)
  ap.add_argument("--prompt_format", default="chat")
  ap.add_argument("--vocabulary", default=None, help="default: --target")
  ap.add_argument("--rows", type=int, default=8, help="sequences, spread over the task")
  ap.add_argument("--depths", type=int, default=4, help="teacher-forced depths")
  ap.add_argument("--gamma", type=int, default=4)
  ap.add_argument("--max_new", type=int, default=200, help="the loop's new tokens per prompt")
  ap.add_argument("--output", required=True, help="a new JSON file")
  args = ap.parse_args()
  if os.path.exists(args.output):
    raise SystemExit(f"--output {args.output!r} exists: records are not overwritten")
  target, target_params = loader.load_model(args.target, dtype="float32")
  draft, params = fd_ckpt.load(args.feature_draft, target_params)
  fd_ckpt.check_target(args.feature_draft, args.target, target_params)
  vocab = tasks_lib.load_vocabulary(args.vocabulary or args.target, required=True)
  spec = data_lib.TaskSpec(name=args.task, input_len=0, target_len=args.target_len,
                           prompt_format=args.prompt_format)
  task = data_lib.tokenize_task(spec, vocab, False, "train")
  if task.prompt_lengths_N is None:
    raise SystemExit(f"--task {args.task!r} is not a decoder-only task with prompts")
  rows = np.linspace(0, task.size - 1, args.rows).astype(int)
  batch = data_lib.batch_of(task, rows)
  prompt_N = task.prompt_lengths_N[rows]
  t = batch["decoder_target_tokens"].shape[1]
  # target position j predicts sequence token j + 1: a reply token from j = prompt - 1 on
  reply_BxT = (batch["loss_weights"] > 0) & (np.arange(t)[None, :] >= prompt_N[:, None] - 1)
  forced = teacher_forced(draft, params, target, target_params, batch, reply_BxT[:, 1:],
                          args.depths)
  seq_NxL = task.targets_NxL[rows]
  prompts_NxP = np.zeros((len(rows), int(prompt_N.max())), np.int32)
  for i, p in enumerate(prompt_N):
    prompts_NxP[i, :p] = seq_NxL[i, :p]
  kept, per_call, out_NxM = loop_depths(draft, params, target, target_params, prompts_NxP,
                                        args.gamma, args.max_new)
  n = min(50, args.max_new)
  same = [bool(np.array_equal(out_NxM[i, :n], seq_NxL[i, p:p + n]))
          for i, p in enumerate(prompt_N)]
  record = {"feature_draft": args.feature_draft, "target": args.target, "task": args.task,
            "rows": rows.tolist(), "gamma": args.gamma, "max_new": args.max_new,
            "teacher_forced_top1_by_depth": forced, "loop_kept_given_previous_by_depth": kept,
            "loop_tokens_per_call": round(per_call, 4), "loop_equals_stored_reply": same}
  os.makedirs(os.path.dirname(os.path.abspath(args.output)), exist_ok=True)
  with open(args.output, "w", encoding="utf-8") as f:
    json.dump(record, f, indent=1)
  print(json.dumps(record, indent=1))


if __name__ == "__main__":
  main()
