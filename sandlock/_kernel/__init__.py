"""Kernel bindings: one module per mechanism, raw syscalls through ctypes.

Nothing in this package imports anything else from sandlock; the rest of sandlock
imports from here. Each syscall has exactly one wrapper, in the module of its mechanism.
"""
