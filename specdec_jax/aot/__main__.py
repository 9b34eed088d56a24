"""`python -m specdec_jax.aot`: see `specdec_jax.aot.cli`."""
from absl import flags

from specdec_jax.aot import cli

__doc__ = cli.__doc__  # --help's text is the main module's docstring: the tool's own
flags.adopt_module_key_flags(cli)  # --help lists the main module's key flags: cli's are these
cli.console_entry()
