"""User-facing errors: the CLIs print these as one line and exit non-zero."""


class TerraformerError(Exception):
  """A problem with the user's input (config, data, paths), not a bug."""
