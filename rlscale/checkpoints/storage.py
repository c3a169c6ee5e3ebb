"""What a write the storage refused looks like: a full disk, a quota, a read-only filesystem, a
directory this user cannot write. The checkpointer turns such a save into one error line
(`checkpointer.StorageError`); the command line and the log filter recognise it the same way."""

from __future__ import annotations

import errno
import os
import re

ERRNOS = (errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES)
# The same failures as tensorstore and orbax put them in their own exceptions' text.
TEXT = re.compile(r"No space left on device|Disk quota exceeded|Read-only file system|"
                  r"Permission denied")


def problem(e: BaseException | None) -> str | None:
  """The storage failure behind `e` (its causes and contexts included), in words; None if it
  is not one."""
  seen = set()
  while e is not None and id(e) not in seen:
    seen.add(id(e))
    if isinstance(e, OSError) and e.errno in ERRNOS:
      return e.strerror or os.strerror(e.errno)
    m = TEXT.search(str(e))
    if m:
      return m.group(0)
    e = e.__cause__ or e.__context__
  return None
