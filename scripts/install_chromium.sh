#!/usr/bin/env bash
# Installs Debian's headless-capable Chromium for the viewer tests (tests/training/test_viewer.py).
# Idempotent: does nothing when a chromium binary is already on PATH. Needs root (or sudo) and apt.
set -euo pipefail

if command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1; then
  echo "chromium already installed: $(command -v chromium || command -v chromium-browser)"
  exit 0
fi

SUDO=""
if [ "$(id -u)" -ne 0 ]; then
  SUDO="sudo"
fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update
# On Ubuntu the chromium package is a snap shim; CI images based on Debian get the real browser.
$SUDO apt-get install -y --no-install-recommends chromium chromium-driver fonts-dejavu-core
command -v chromium
