"""Checkpoints: every supported format is read into the T5X `target` parameter tree.

Formats: our own Orbax dir (`orbax_io`), T5X legacy msgpack + zarr (`t5x_legacy`), T5X Orbax/OCDBT
(`t5x_orbax`), Hugging Face T5 v1.1 (`hf`). `load_checkpoint` detects which and validates the tree
against the model config (`tree`).
"""
from specdec_jax.checkpoints.loading import detect_format, load_checkpoint
from specdec_jax.checkpoints.tree import (CheckpointError, check_vocab_compatible, stack_layers,
                                          unstack_layers)

__all__ = ["load_checkpoint", "detect_format", "CheckpointError", "check_vocab_compatible",
           "stack_layers", "unstack_layers"]
