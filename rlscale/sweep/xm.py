"""XManager launcher (being written)."""


class XMLauncher:
  def __init__(self, *args, **kwargs):
    raise NotImplementedError("the XManager launcher is not written yet")
