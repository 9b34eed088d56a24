"""The runner's view of drafts: names, kinds, and the calibration decode (review defects 3-5).

Why: a sweep files each draft's results under its name, refuses a draft that cannot serve the
target before anything compiles, and chooses GAMMA='auto' from an alpha that must be the prompts'
alpha, not the padding's.
"""
from types import SimpleNamespace

import jax
import numpy as np
import pytest

from specdec_jax.decoding.decoder import Decoder, Params
from specdec_jax.decoding.drafter import TokenDrafter
from specdec_jax.decoding.lookup_token import LookupTokenDrafter
from specdec_jax.decoding.sampling import SamplingConfig
from specdec_jax.decoding.speculative import Chain
from specdec_jax.models.model import Model
from specdec_jax.models.model_config import get_preset
from specdec_jax.runner import calibrate, measure, pipeline, run_config as config_lib
from specdec_jax.runner.run_config import DraftSpec, RunConfig
from specdec_jax.testing import WrongOnRows, tiny_pair


def test_drafts_in_same_named_folders_get_distinct_names():
  """Defect 3: runs/a/export and runs/b/export were both 'export' (one decoded, both reported)."""
  cfg = RunConfig(draft_checkpoint=["runs/a/export", "runs/b/export", "runs/b/other"],
                  gamma=[2, 3])
  specs = config_lib.draft_specs(cfg)
  assert [s.name for s in specs] == ["a/export", "b/export", "other"]
  keys = [p.key for p in config_lib.points(cfg)]
  assert len(keys) == len(set(keys)) == 6
  # Named twice is the same draft, decoded once.
  assert len(config_lib.draft_specs(RunConfig(draft_checkpoint=["x/d", "x/d"]))) == 1
  assert DraftSpec("model", "runs/a/export").name == "export"  # no clash: the folder name


def test_draft_of_the_other_kind_is_refused_at_load():
  """Defect 4: a T5 target with a decoder-only draft ran to the end with alpha 0.000."""
  cfg = RunConfig(target_checkpoint="t5_test_target", draft_checkpoint="decoder_test_draft",
                  task="configs/local/smoke_prompts.jsonl", num_examples=2, max_input_length=32)
  with pytest.raises(ValueError, match=r"decoder_test_draft.*decoder-only.*kind 'decoder'.*"
                                       r"encoder-decoder \(T5\) model \(kind 't5'\)"):
    pipeline.load(cfg)


def test_calibration_alpha_counts_real_rows_only():
  """Defect 5: rows that pad a batch to a data-parallel mesh entered the calibration alpha."""
  target, tp, _, _ = tiny_pair("decoder", seed=5)
  draft = WrongOnRows(target, rows=(1,))  # agrees on row 0, never on row 1 (the padding row)
  a = np.array([[5, 6, 7, 2]], np.int32)
  b = np.array([[9, 3, 0, 0]], np.int32)
  decoder = Decoder(target, draft, Chain(3), SamplingConfig(), rule="tokenwise", max_decode_len=8)

  def alpha(x, rows):
    return calibrate.calibration_acceptance(decoder, Params(tp, tp), x, rows=rows, seed=0)["alpha"]
  alone = alpha(a, rows=1)
  padded = alpha(np.concatenate([a, b]), rows=1)
  both = alpha(np.concatenate([a, b]), rows=2)
  assert alone == pytest.approx(1.0) and padded == pytest.approx(1.0)
  assert both < 0.9  # the padding row would have pulled it down


def test_calibration_decodes_a_per_batch_choice_in_the_runs_batch_shape(monkeypatch):
  """The lookup-first choice is one per iteration for the whole batch, so a calibration decode of
  every prompt in one batch described another program than the run's batch-1 decode (SmolLM2
  HumanEval: A_1 0.99 calibrated against 0.88 measured, the lookup almost never drafting).
  `calibration_acceptance` over a list of batches is the merge of their decodes, with the lookup
  share the record's prediction reads, and `Calibration.decode` hands it the run's batches."""
  target = Model(get_preset("decoder_test_target", vocab_size=16, eos_id=-1))
  tp = target.init(jax.random.key(0))  # a small vocabulary: outputs repeat, the lookup matches
  drafter = LookupTokenDrafter(draft_gamma=2, lookup_ngram=1)
  assert drafter.chooses_per_batch and not getattr(TokenDrafter(), "chooses_per_batch", False)
  decoder = Decoder(target, target, Chain(3), SamplingConfig(), max_decode_len=16,
                    drafter=drafter)
  params = Params(tp, tp)
  inputs = np.array([[5, 6, 7, 5, 6, 0], [3, 4, 3, 4, 3, 4], [9, 9, 9, 0, 0, 0],
                     [7, 0, 0, 0, 0, 0]], np.int32)
  acc = lambda x, rows: calibrate.calibration_acceptance(decoder, params, x, rows=rows,  # noqa: E731
                                                         seed=0)
  rows = [acc(inputs[i:i + 1], 1) for i in range(4)]
  calls = [int(np.sum(decoder.generate(params, inputs[i:i + 1],
                                       jax.random.key(7919)).counters.target_calls_B))
           for i in range(4)]
  weighted = lambda f: sum(f(r) * n for r, n in zip(rows, calls)) / sum(calls)  # noqa: E731
  apart = acc([inputs[i:i + 1] for i in range(4)], [1, 1, 1, 1])
  assert apart["lookup_share"] == pytest.approx(weighted(lambda r: r["lookup_share"]))
  assert apart["accept_at_least"] == pytest.approx(
      [weighted(lambda r, i=i: r["accept_at_least"][i]) for i in range(3)])
  assert 0 < apart["lookup_share"] < 1
  assert acc(inputs, 4)["lookup_share"] < apart["lookup_share"]  # every row must match at once
  # The run's measure decodes in the run's batch size (a fake run: batch 1, 4 prompts).
  seen = []
  prompts = SimpleNamespace(ids=list(range(4)), batch=lambda pos: inputs[list(pos)])
  loaded = SimpleNamespace(calibration=prompts, held_out=True, mesh=None)
  monkeypatch.setattr(measure, "decoder_for", lambda *a, **k: (decoder, params))
  point = SimpleNamespace(temperature=0.0, draft="d")
  measure.Calibration(RunConfig(batch_size=1), loaded, log=print).decode(
      point, 2, lambda d, p, x, rows: seen.append((len(x), rows)))
  measure.Calibration(RunConfig(batch_size=4), loaded, log=print).decode(
      point, 2, lambda d, p, x, rows: seen.append((x.shape, rows)))
  assert seen == [(4, [1, 1, 1, 1]), ((4, 6), 4)]


def test_the_loops_fixed_costs_are_measured_at_every_calibration_width():
  """`Calibration.widths`: one batch of the run's shape per width the calibration prompts have
  and the timed batches lack, and every calibration batch's width (what the fixed costs are
  averaged over, `costs.LoopCosts.calibrated_fixed`); a short last batch is not timed."""
  from specdec_jax.runner.inputs import Prompts
  lengths = [3, 5, 4, 20, 40, 6, 30, 70, 2]
  ids = [list(range(1, n + 1)) for n in lengths]
  cal = Prompts(list(range(len(ids))), ids, None, width=70)
  loaded = SimpleNamespace(calibration=cal, held_out=True, mesh=None)
  one = measure.Calibration(RunConfig(batch_size=1, auto_timing_examples=2), loaded, log=print)
  batches, widths = one.widths()
  assert widths == [16, 16, 16, 32, 64, 16, 32, 70, 16]  # buckets: powers of two, at most 70
  assert [b.shape for b in batches] == [(1, 32), (1, 64), (1, 70)]  # the timed ones are 16 wide
  two = measure.Calibration(RunConfig(batch_size=2, auto_timing_examples=2), loaded, log=print)
  batches, widths = two.widths()
  assert widths == [16, 32, 64, 70, 16]  # the last batch is one prompt
  assert [b.shape for b in batches] == [(2, 32), (2, 64), (2, 70)]
