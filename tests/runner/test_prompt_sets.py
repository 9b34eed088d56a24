"""The benchmark protocol's prompt sets: calibration prompts never measured, seeded, representative.

Why: when 'auto' and the prediction were calibrated on the first prompts they were then judged
on, neither carried to new prompts (runner/prompt_sets.py).
"""
import pytest

from specdec_jax.runner import prompt_sets


def test_held_out_calibration_is_disjoint_from_the_measured_prompts():
  s = prompt_sets.choose(975, num_examples=100, calibration_examples=16, sample=True, seed=0)
  assert len(s.measured) == 100 and len(s.calibration) == 16 and s.held_out
  assert not set(s.measured) & set(s.calibration)
  assert list(s.measured) == sorted(s.measured)  # task order, so predictions.jsonl reads in order


def test_the_same_seed_picks_the_same_prompts_and_another_seed_others():
  a = prompt_sets.choose(975, num_examples=100, calibration_examples=16, sample=True, seed=0)
  assert a == prompt_sets.choose(975, num_examples=100, calibration_examples=16, sample=True,
                                 seed=0)
  b = prompt_sets.choose(975, num_examples=100, calibration_examples=16, sample=True, seed=1)
  assert a.measured != b.measured


def test_a_sample_spreads_over_the_split_and_the_head_does_not():
  s = prompt_sets.choose(975, num_examples=100, calibration_examples=16, sample=True, seed=0)
  assert max(s.measured) > 800 and min(s.measured) < 100
  head = prompt_sets.choose(975, num_examples=100, calibration_examples=16, seed=0)
  assert len(head.measured) == 100 and max(head.measured) < 120
  assert not set(head.measured) & set(head.calibration)


def test_in_sample_calibrates_on_the_first_measured_prompts():
  s = prompt_sets.choose(8, num_examples=8, calibration_examples=4, calibration="in_sample")
  assert s.measured == tuple(range(8)) and s.calibration == (0, 1, 2, 3) and not s.held_out


def test_all_examples_but_the_held_out_ones_and_refusals():
  s = prompt_sets.choose(10, num_examples=None, calibration_examples=3, seed=2)
  assert len(s.measured) == 7 and sorted(s.measured + s.calibration) == list(range(10))
  with pytest.raises(ValueError, match="all taken by the 3 held-out"):
    prompt_sets.choose(3, num_examples=None, calibration_examples=3)
  with pytest.raises(ValueError, match="calibration must be one of"):
    prompt_sets.choose(10, num_examples=2, calibration_examples=1, calibration="first")
