"""Builds the C++ core with CMake (one build description for the library, module and tests).

Environment:
  BRICK_BUILD_DIR      CMake build folder (default: build/release), kept between builds.
  BRICK_BUILD_TESTS=1  also build the GoogleTest suites (run them with ctest in that folder).
  BRICK_BUILD_TYPE     CMake build type (default: Release).
  BRICK_CMAKE_ARGS     more CMake arguments, separated by spaces (e.g.
                       -DBRICK_GTEST_SOURCE_DIR=... where no GoogleTest is installed).
"""

import os
import shutil
import subprocess
import sys
from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

ROOT = Path(__file__).resolve().parent


class CMakeExtension(Extension):
    def __init__(self, name: str):
        super().__init__(name, sources=[])


class CMakeBuild(build_ext):
    def build_extension(self, ext: Extension) -> None:
        build_dir = Path(os.environ.get("BRICK_BUILD_DIR", ROOT / "build" / "release")).resolve()
        build_dir.mkdir(parents=True, exist_ok=True)
        generator = ["-G", "Ninja"] if shutil.which("ninja") else []
        configure = [
            "cmake", str(ROOT), *generator,
            f"-DPython_EXECUTABLE={sys.executable}",
            f"-DCMAKE_BUILD_TYPE={os.environ.get('BRICK_BUILD_TYPE', 'Release')}",
            f"-DBRICK_BUILD_TESTS={'ON' if os.environ.get('BRICK_BUILD_TESTS') == '1' else 'OFF'}",
            *os.environ.get("BRICK_CMAKE_ARGS", "").split(),
        ]
        subprocess.check_call(configure, cwd=build_dir)
        jobs = os.environ.get("CMAKE_BUILD_PARALLEL_LEVEL", str(os.cpu_count() or 2))
        subprocess.check_call(["cmake", "--build", ".", "--parallel", jobs], cwd=build_dir)

        target = Path(self.get_ext_fullpath(ext.name)).parent
        target.mkdir(parents=True, exist_ok=True)
        built = next(build_dir.glob("_C*.so"))
        shutil.copy2(built, target / Path(self.get_ext_fullpath(ext.name)).name)


setup(ext_modules=[CMakeExtension("torch_brickdev._C")], cmdclass={"build_ext": CMakeBuild})
