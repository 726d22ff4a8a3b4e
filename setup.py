"""What pyproject.toml cannot say: the repository's ``configs/`` installs as the package
``omni_edge_configs``, beside ``exports``, so the shipped pipelines' relative paths
(``../exports/…``, ``../models/…``) resolve against their own files once installed as they do
in a checkout (``orchestrator.pipelines``). Everything else is in pyproject.toml."""

from setuptools import find_packages, setup

setup(
    packages=[
        *find_packages(include=["orchestrator*", "stages*", "exports*"]),
        "omni_edge_configs",
    ],
    package_dir={"omni_edge_configs": "configs"},
)
