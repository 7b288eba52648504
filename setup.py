"""Builds the static exec trampoline (sandlock/_libexec/sandlock-exec) with the package.

Metadata lives in pyproject.toml; this file only adds the compile step, because the
trampoline is an executable, not a Python extension module.
"""

import os
import subprocess

from setuptools import setup
from setuptools.command.build_py import build_py

SRC = os.path.join("sandlock", "_libexec", "sandlock-exec.c")


class BuildWithHelper(build_py):
    def run(self):
        super().run()
        for root in {os.path.join(self.build_lib, "sandlock", "_libexec"),
                     os.path.join("sandlock", "_libexec")}:
            if os.path.isdir(root):
                out = os.path.join(root, "sandlock-exec")
                subprocess.check_call(["cc", "-O2", "-Wall", "-Wextra", "-static", "-o", out,
                                       SRC])


setup(cmdclass={"build_py": BuildWithHelper},
      package_data={"sandlock": ["_libexec/sandlock-exec.c"]})
