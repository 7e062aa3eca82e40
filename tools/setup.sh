#!/usr/bin/env bash
# Install the Debian 12 packages strata builds with, if any are missing (idempotent).
set -euo pipefail
pkgs=(build-essential cmake pkg-config libopenblas-dev libopenblas-openmp-dev libjson-c-dev liburing-dev python3 jq)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "strata setup: installing ${missing[*]}" >&2
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO=sudo
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}" >/dev/null
fi
