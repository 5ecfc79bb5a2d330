"""Opening ``root/name`` so that no link, however it is swapped in meanwhile, leads outside ``root``."""

from __future__ import annotations

import ctypes
import errno
import os
import stat as statmod

from dataferry.sources.base import safe_name

__all__ = ["open_beneath"]

_SYS_OPENAT2 = 437  # the same number on every architecture Linux added it to (5.6+)
_RESOLVE_NO_MAGICLINKS, _RESOLVE_BENEATH = 0x02, 0x08
_libc = ctypes.CDLL(None, use_errno=True)
_libc.syscall.restype = ctypes.c_long


class _OpenHow(ctypes.Structure):
    _fields_ = [("flags", ctypes.c_uint64), ("mode", ctypes.c_uint64), ("resolve", ctypes.c_uint64)]


def _openat2(dir_fd: int, name: str, flags: int) -> int:
    how = _OpenHow(flags, 0, _RESOLVE_BENEATH | _RESOLVE_NO_MAGICLINKS)
    fd = _libc.syscall(ctypes.c_long(_SYS_OPENAT2), ctypes.c_int(dir_fd), ctypes.c_char_p(os.fsencode(name)),
                       ctypes.byref(how), ctypes.c_size_t(ctypes.sizeof(how)))
    if fd < 0:
        e = ctypes.get_errno()
        raise OSError(e, os.strerror(e), name)
    return int(fd)


def _walk_no_follow(dir_fd: int, name: str, flags: int) -> int:
    """Where openat2 is missing: open each component relative to the last, following no link."""
    parts = name.split("/")
    fd = os.dup(dir_fd)
    try:
        for part in parts[:-1]:
            try:
                nxt = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd)
            except NotADirectoryError:  # a link, or a file where a folder should be
                if statmod.S_ISLNK(os.stat(part, dir_fd=fd, follow_symlinks=False).st_mode):
                    raise OSError(errno.ELOOP, "a link in the path", name) from None
                raise
            os.close(fd)
            fd = nxt
        return os.open(parts[-1], flags | os.O_NOFOLLOW, dir_fd=fd)
    finally:
        os.close(fd)


_HAS_OPENAT2 = True


def open_beneath(root: str | os.PathLike[str], name: str, flags: int = os.O_RDONLY) -> int:
    """A descriptor for ``root/name`` that cannot lead outside ``root``, however its folders are
    swapped for links meanwhile: ``openat2(RESOLVE_BENEATH)``, else a walk that follows no link.
    ``ValueError`` when the name leads outside; ``OSError`` as ``open`` raises otherwise."""
    global _HAS_OPENAT2
    safe_name(name)
    flags |= os.O_CLOEXEC | os.O_NONBLOCK  # a FIFO planted under the name must not block us
    root_fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        if _HAS_OPENAT2:
            try:
                return _openat2(root_fd, name, flags)
            except OSError as e:
                if e.errno not in (errno.ENOSYS, errno.EPERM):  # EPERM: a seccomp filter refused it
                    raise
                _HAS_OPENAT2 = False
        return _walk_no_follow(root_fd, name, flags)
    except OSError as e:
        if e.errno in (errno.EXDEV, errno.ELOOP):
            raise ValueError(f"invalid object name {name!r}: it leads outside {root} (through a link)") from None
        raise
    finally:
        os.close(root_fd)
