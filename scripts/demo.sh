#!/usr/bin/env bash
# Installs moe-swift and runs the demo: a Qwen3-30B-A3B-shaped MoE layer, decode and prefill.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh
python3 examples/demo.py "$@"
