"""Draft trees: several candidates per position, verified in one target call.

- `shape`: a tree as static data (`Tree`; `DynamicTree`, a dynamic tree's budget).
- `verify`: the tree verifiers beside `acceptance.tokenwise` / `.block`: `greedy` and the exact
  `recursive_rejection`.
- `commit`: the kept path into the caches (`commit_path`) and the state (`commit_tree`).
- `scheme`: `TreeScheme`, a static tree per iteration; `dynamic`: `DynamicTreeScheme`, an
  EAGLE-2 style tree chosen per row. Both take any drafter (`decoding.drafter`).
- `token_path`: the static trees at temperature 0 as token ids.
- `lookup`, `lookup_verify`, `lookup_scheme`: `LookupTreeScheme`, prompt-lookup branches.
"""
from specdec_jax.decoding.tree.shape import Tree  # noqa: F401
from specdec_jax.decoding.tree.verify import TreeVerdict, greedy  # noqa: F401
from specdec_jax.decoding.tree.verify import recursive_rejection  # noqa: F401
from specdec_jax.decoding.tree.verify import sample_without_replacement  # noqa: F401
from specdec_jax.decoding.tree.scheme import TreeScheme  # noqa: F401
from specdec_jax.decoding.tree.shape import DynamicTree  # noqa: F401
from specdec_jax.decoding.tree.dynamic import DynamicTreeScheme  # noqa: F401
