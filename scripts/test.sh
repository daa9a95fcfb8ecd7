#!/usr/bin/env bash
# Installs moe-swift with its test extras and runs every test: `swift test`, then pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh test
swift test 2>&1
python3 -m pytest -q --durations=30
