"""Maps the fixed top-level folders onto the one import namespace ``brickwork.*``.

The package list is discovered, so a new sub-folder with an ``__init__.py`` installs without edits here.
"""

from setuptools import find_packages, setup

FOLDERS = {
    "brickwork": "brickwork",
    "brickwork.components": "components",
    "brickwork.kernels": "kernels",
    "brickwork.blocks": "blocks",
    "brickwork.factory": "factory",
    "brickwork.parallel": "parallel",
    "brickwork.benchmarks": "benchmarks",
}

packages = []
for package, folder in FOLDERS.items():
    packages.append(package)
    packages.extend(f"{package}.{sub}" for sub in find_packages(folder))

setup(packages=packages, package_dir=FOLDERS)
