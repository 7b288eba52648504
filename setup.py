"""Builds the C helpers with the package: the static exec trampoline
(sandlock/_libexec/sandlock-exec, from sandlock-exec.c and sandlock-init.c) and the two
shared libraries the supervisor loads (the COW fork loop and the connect fast path), with
the same flags as the Makefile's `helper` target.

Metadata lives in pyproject.toml; this file only adds the compile step, because the
helpers are an executable and plain shared objects, not Python extension modules.
"""

import os
import subprocess

from setuptools import setup
from setuptools.command.build_py import build_py

LIBEXEC = os.path.join("sandlock", "_libexec")
FLAGS = ["-O2", "-Wall", "-Wextra", "-Werror"]
HELPERS = [  # (output, extra flags, sources)
    ("sandlock-exec", ["-static"], ["sandlock-exec.c", "sandlock-init.c"]),
    ("libsandlock-fork.so", ["-shared", "-fPIC"], ["forkloop.c"]),
    ("libsandlock-fastconnect.so", ["-shared", "-fPIC", "-pthread"],
     ["fastconnect.c", "fastcow.c"]),
]
SOURCES = ["sandlock-exec.c", "sandlock-init.c", "sandlock-init.h", "forkloop.c",
           "fastconnect.c", "fastcow.c", "fastpath.h"]


class BuildWithHelper(build_py):
    def run(self):
        super().run()
        for root in {os.path.join(self.build_lib, LIBEXEC), LIBEXEC}:
            if os.path.isdir(root):
                for out, extra, sources in HELPERS:
                    subprocess.check_call(["cc", *FLAGS, *extra, "-o", os.path.join(root, out),
                                           *(os.path.join(LIBEXEC, s) for s in sources)])


setup(cmdclass={"build_py": BuildWithHelper},
      package_data={"sandlock": [f"_libexec/{s}" for s in SOURCES]})
