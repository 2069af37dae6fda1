"""The package is typed (py.typed) and clean under ``mypy --strict``, with a handler written as a
user would (tests/agents.py) and the examples."""

from __future__ import annotations

import subprocess
import sys

import pytest

from conftest import REPO, SDK_ROOT, SDK_SRC, TESTS


def test_the_package_ships_py_typed() -> None:
    assert (SDK_SRC / "corral_worker" / "py.typed").is_file()


def test_mypy_strict_is_clean() -> None:
    probe = subprocess.run([sys.executable, "-m", "mypy", "--version"], capture_output=True, text=True)
    if probe.returncode != 0:
        pytest.fail(f"mypy is not installed for {sys.executable}: apt-get install mypy (Debian) or pip install mypy")
    targets = [
        str(SDK_SRC / "corral_worker"),
        str(TESTS / "agents.py"),
        *map(str, sorted((REPO / "examples" / "python").glob("*.py"))),
    ]
    p = subprocess.run(
        [
            sys.executable,
            "-m",
            "mypy",
            "--strict",
            "--config-file",
            str(SDK_ROOT / "pyproject.toml"),
            "--no-incremental",
            *targets,
        ],
        capture_output=True,
        text=True,
        cwd=SDK_ROOT,
        env={"MYPYPATH": str(SDK_SRC), "PATH": "/usr/bin:/bin"},
    )
    assert p.returncode == 0, p.stdout + p.stderr
