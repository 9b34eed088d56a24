"""scan_layers: stacked trees load into the unrolled model; asking the model to scan fails loudly."""
import numpy as np
import pytest

from specdec_jax.checkpoints import load_checkpoint
from specdec_jax.models.config import get_preset
from specdec_jax.models.model import Model


def test_model_refuses_scan_layers_with_a_clear_error():
  with pytest.raises(NotImplementedError, match=r"scan_layers=False"):
    Model(get_preset("t5_test_draft", scan_layers=True))


def test_stacked_random_init_unstacks_to_the_same_weights():
  cfg, stacked = load_checkpoint("t5_test_draft", scan_layers=True, seed=4)
  assert cfg.scan_layers and "layers" in stacked["decoder"]
  _, flat = load_checkpoint("t5_test_draft", scan_layers=False, seed=4)
  np.testing.assert_array_equal(stacked["decoder"]["layers"]["mlp"]["wo"]["kernel"][0],
                                flat["decoder"]["layers_0"]["mlp"]["wo"]["kernel"])
