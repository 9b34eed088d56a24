"""`python -m specdec_jax.aot`: see `specdec_jax.aot.cli`."""
from specdec_jax.aot.cli import console_entry

console_entry()
