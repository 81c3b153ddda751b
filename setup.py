"""Package discovery only; metadata lives in pyproject.toml.

quantize/, runtime/ and plugins/ sit at the top of the repository but install as sub-packages of
edgeattn, so the package list is computed from the folder map (subfolders are picked up on their own).
"""
from setuptools import find_packages, setup

FOLDERS = {
    "edgeattn": "edgeattn",
    "edgeattn.quantize": "quantize",
    "edgeattn.runtime": "runtime",
    "edgeattn.plugins": "plugins",
}

packages = []
for name, folder in FOLDERS.items():
    packages.append(name)
    packages += [f"{name}.{sub}" for sub in find_packages(folder)]

setup(packages=packages, package_dir=FOLDERS)
