"""User-facing errors: the CLIs print these as one line and exit non-zero."""


class TerraformerError(Exception):
  """A problem with the user's input (config, data, paths), not a bug."""


def first_line(error, limit=None):
  """The first non-blank line of `str(error)` (its class name if none),
  cut to `limit` characters."""
  lines = [line.strip() for line in str(error).splitlines() if line.strip()]
  return (lines[0] if lines else type(error).__name__)[:limit]
