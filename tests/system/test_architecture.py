"""The dependency rule of docs/architecture.md, checked on the import statements of every module."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

# package (or subpackage) -> top-level names its modules may not import
FORBIDDEN: dict[str, set[str]] = {
    "snapshot": {"store", "pool", "client", "clink", "grpc", "boto3", "click", "rich", "duckdb", "pyiceberg"},
    "store": {"pool", "client", "clink", "grpc", "click", "rich", "duckdb", "pyiceberg"},
    "pool": {"client", "clink", "click", "rich", "duckdb", "pyiceberg"},
    "client": {"store", "pool", "clink", "boto3", "click", "rich", "duckdb", "pyiceberg"},
    "clink/tools": {"click", "rich", "clink.cli"},
}


def _imports(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return names


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_no_module_imports_across_the_dependency_rule(package: str) -> None:
    offences = []
    for path in sorted((REPO / package).rglob("*.py")):
        for name in _imports(path):
            if any(name == banned or name.startswith(banned + ".") for banned in FORBIDDEN[package]):
                offences.append(f"{path.relative_to(REPO)} imports {name}")
    assert offences == []


def test_store_imports_boto3_in_its_s3_module_only() -> None:
    users = [
        p.relative_to(REPO).as_posix()
        for p in sorted((REPO / "store").rglob("*.py"))
        if any(n.split(".")[0] in ("boto3", "botocore") for n in _imports(p))
    ]
    assert users == ["store/s3.py"]


def test_importing_the_worker_client_loads_no_cli_or_analytics_dependency() -> None:
    code = "import client, sys; print(sorted(m for m in ('duckdb','pyiceberg','click','rich','boto3','store','pool') if m in sys.modules))"
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60, check=True)
    assert done.stdout.strip() == "[]"
