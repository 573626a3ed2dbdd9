#!/usr/bin/env bash
# Installs the Express baseline's dependencies (express, pg) from the npm registry into
# node_modules/ beside this script. node_modules is never committed (.gitignore).
set -euo pipefail
cd "$(dirname "$0")"
command -v npm >/dev/null || { echo "setup.sh: npm not found (install Node.js 18 or later)" >&2; exit 1; }
npm install --no-audit --no-fund
