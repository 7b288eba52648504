"""The few private helpers upstream's own tests reach for (`from sandlock._sdk import
_lib`), answered from this implementation. There is no native library here: `_lib`
offers only these calls."""

from __future__ import annotations


class _Lib:
    @staticmethod
    def sandlock_syscall_nr(name: bytes) -> int:
        """The syscall's number on this architecture, or -1."""
        from .syscall_filter import syscall_number
        try:
            return syscall_number(name.decode() if isinstance(name, bytes) else name)
        except (ValueError, UnicodeDecodeError):
            return -1

    @staticmethod
    def sandlock_protection_min_abi(protection: int) -> int:
        from .features import Protection
        return Protection(protection).min_abi

    @staticmethod
    def sandlock_handle_free(handle) -> None:
        """Handles are Python objects here: nothing to free."""


_lib = _Lib()
