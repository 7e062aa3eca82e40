#!/usr/bin/env bash
# Install what is missing, build, and run the whole test suite (what .ci/run calls).
set -euo pipefail
cd "$(dirname "$0")/.."
bash tools/setup.sh
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build -j"$(nproc)"
cd build
ctest --output-on-failure -j1 --timeout 300
