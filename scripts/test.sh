#!/usr/bin/env bash
# Set up from scratch (idempotent) and run the whole test suite: lint, types, tests.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/bootstrap.sh
. .venv/bin/activate
export PYTHONUNBUFFERED=1
echo "== ruff"; ruff check orchestrator stages exports tests bench
echo "== ruff format (the formatter owns layout and line length)"; ruff format --check orchestrator stages exports tests bench scripts
echo "== mypy"; mypy
echo "== lint-imports (layering contracts in pyproject.toml)"; lint-imports --no-logo
# --require-assets: a test that skips for a missing asset, toolchain or route fails (tests/helpers/skips.py);
# skips for another platform, a capability this machine lacks, or a case excluded by design stay skips.
echo "== pytest"; python -m pytest --require-assets "$@"
