"""GAMMA='tree' with the lookup-tree module: one gin file switches a prompt-lookup run to
prompt-lookup tree branches, beside the chain in one run, visible in metrics.json.

Why: `LookupTreeScheme` rides the runner's tree path (duck-typed like `TreeScheme`: `tree`,
`verifier`, `gamma`); this checks that path end to end with a model-free draft: the tree it ran
(K chains of L), greedy outputs equal to the baseline's, per-path counters.
"""
import pytest

from specdec_jax import run

pytestmark = pytest.mark.usefixtures("clean_gin")


@pytest.mark.slow  # ~25 s on 2 cores; the scheme's own tests stay in the fast suite
def test_lookup_tree_module_runs_beside_the_chain(tmp_path):
  metrics = run.run(["configs/local/smoke.gin", "gin/decoding/lookup_tree.gin"], str(tmp_path), [
      "GAMMA = [3, 'tree']", "NUM_EXAMPLES = 4", "MAX_DECODE_LENGTH = 8",
      "RunConfig.repeats = 1", "LookupTreeScheme.branches = 2", "LookupTreeScheme.length = 3"])
  chain, tree = metrics
  assert chain["run"] == "draft=prompt_lookup,gamma=3,temperature=0"
  assert tree["run"] == "draft=prompt_lookup,gamma=tree,temperature=0"
  assert tree["tree"]["nodes"] == 7 and tree["tree"]["depth"] == 3
  assert tree["tree"]["parents"] == [-1, 0, 1, 2, 0, 4, 5]
  assert tree["greedy_match_rate"] == 1.0 and chain["greedy_match_rate"] == 1.0
  assert tree["tokens_per_target_call"] >= 1.0 and tree["mean_gamma"] <= 3.0
