"""The AOT builder with a dynamic (EAGLE-2 style) tree among GAMMA='auto''s candidates.

Why: a dynamic tree has no parent list, and the builder must still list (and compile) its own
prefill and loop, named apart from a static tree of the same size and recorded with its budget,
beside the static candidates, so an AOT job over an 'auto' config with one does not crash.
"""
import jax
import numpy as np
import pytest
from jax.sharding import Mesh

from specdec_jax import sharding as sh
from specdec_jax.aot import programs
from specdec_jax.checkpoints import loader
from specdec_jax.decoding.tree.dynamic import DynamicTreeScheme
from specdec_jax.decoding.tree.scheme import TreeScheme
from specdec_jax.runner.run_config import RunConfig

DYN = DynamicTreeScheme(depth=2, width=2, branch=2, nodes=5)
BUDGET = {"depth": 2, "width": 2, "branch": 2, "nodes": 5}


def _programs():
  cfg = RunConfig(gamma="auto", gamma_max=2, tree_candidates=[(2, 2), DYN], batch_size=1,
                  max_input_length=8, max_decode_length=8)
  mesh = Mesh(np.asarray(jax.devices()[:1]).reshape(1, 1, 1), sh.MESH_AXES)
  setup = programs.decode_setup(cfg, mesh, sh.MeshConfig(data=1, model_outer=1, model_inner=1),
                                loader.preset_config("t5_test_target"),
                                {"d": loader.preset_config("t5_test_draft")})
  return cfg, mesh, programs.decode_programs(setup, mesh)


def test_the_builder_lists_a_dynamic_candidate_with_its_budget():
  cfg, _, progs = _programs()
  assert programs.trees_to_compile(cfg) == (TreeScheme((2, 2)), DYN)
  dyn = [p for p in progs if "tree_dynamic" in p.info]
  assert [p.kind for p in dyn] == [programs.SPEC_PREFILL, programs.SPEC_LOOP]
  assert dyn[0].name == "spec_prefill[draft=d,tree=dynamic/width2/branch2/5n/depth2]"
  assert dyn[1].needs == dyn[0].name
  for p in dyn:  # the slack its caches need, its verify width and depth, no parents
    assert p.info["tree_dynamic"] == BUDGET and p.info["gamma"] == DYN.gamma == 4
    assert p.info["tree_nodes"] == 5 and p.info["tree_depth"] == 2
    assert "tree_parents" not in p.info
  static = [p for p in progs if "tree_parents" in p.info]
  assert [p.info["tree_nodes"] for p in static] == [7, 7]  # the static (2, 2) beside it


@pytest.mark.slow  # ~10 s on 2 cores: the dynamic tree's prefill and loop compiled for the CPU
def test_the_dynamic_candidate_compiles():
  _, mesh, progs = _programs()
  compiled = {}
  with jax.set_mesh(mesh):
    for p in (p for p in progs if "tree_dynamic" in p.info):
      fn, args, kwargs = p.call(compiled)
      compiled[p.name] = fn.lower(*args, **kwargs).compile()
  assert len(compiled) == 2
