"""Draft trees (issue 29): several candidates per position, verified in one target call.

- `shape`: a tree as static data (`Tree`: parents, depths, sibling ranks, the ancestor mask, paths).
- `verify`: the tree verifiers, pure functions beside `acceptance.tokenwise` / `.block`: `greedy`
  and `recursive_rejection` (exact at T > 0: siblings drawn without replacement, tried in turn
  against the running residual).
- `commit`: the kept path's cache entries gathered into consecutive slots (`commit_path`).
- `scheme`: `TreeScheme`, the Decoder scheme that drafts a tree, verifies it in one target call
  and commits the kept path.
- `dynamic`: `DynamicTreeScheme`, a dynamic (EAGLE-2 style) tree: beam expansion by cumulative
  draft log-probability, the best N - 1 candidates verified, exact (pruned children are tried).
  Both trees take any drafter (`decoding.drafter`): a token draft, or a feature-level draft
  drafting from the target's states.
- `token_path`: the static trees at temperature 0 as token ids (argmax tables, not one-hot rows;
  the same result bit for bit).
"""
from specdec_jax.decoding.tree.shape import Tree  # noqa: F401
from specdec_jax.decoding.tree.verify import TreeVerdict, greedy  # noqa: F401
from specdec_jax.decoding.tree.verify import recursive_rejection  # noqa: F401
from specdec_jax.decoding.tree.verify import sample_without_replacement  # noqa: F401
from specdec_jax.decoding.tree.scheme import TreeScheme  # noqa: F401
from specdec_jax.decoding.tree.shape import DynamicTree  # noqa: F401
from specdec_jax.decoding.tree.dynamic import DynamicTreeScheme  # noqa: F401
