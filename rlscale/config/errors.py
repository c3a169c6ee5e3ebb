"""The error of a config field whose value cannot work: one line naming the field."""


class ConfigError(ValueError):
  """A config field with a value that cannot work; the message names it."""
