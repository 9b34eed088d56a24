"""Checkpoints: every supported format is read into the T5X `target` parameter tree.

Formats: our own Orbax dir (`orbax_io`), T5X legacy msgpack + zarr (`t5x_legacy`), T5X Orbax/OCDBT
(`t5x_orbax`), Hugging Face T5 v1.1 (`hf`). `load_checkpoint` detects which and validates the tree
against the model config (`tree`). `loader.load_model` is the one door from a run's name for a
model (a checkpoint path or a preset) to `(Model, params)`; `loader.model_config` its half that
reads no weight.
"""
from specdec_jax.checkpoints.weights import detect_format, load_checkpoint
from specdec_jax.checkpoints.tree import (CheckpointError, check_vocab_compatible, stack_layers,
                                          unstack_layers)

__all__ = ["load_checkpoint", "detect_format", "CheckpointError", "check_vocab_compatible",
           "stack_layers", "unstack_layers"]
