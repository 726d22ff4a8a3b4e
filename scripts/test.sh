#!/usr/bin/env bash
# Set up from scratch (idempotent) and run the whole test suite: lint, types, tests.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/bootstrap.sh
. .venv/bin/activate
export PYTHONUNBUFFERED=1
echo "== ruff"; ruff check orchestrator stages exports tests bench
echo "== mypy"; mypy
echo "== lint-imports (layering contracts in pyproject.toml)"; lint-imports --no-logo
echo "== pytest"; python -m pytest "$@"
