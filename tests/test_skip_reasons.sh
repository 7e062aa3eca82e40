#!/usr/bin/env bash
# test_skip_reasons.sh - the tests that need something of the machine skip (77) naming what
# is missing, not a wrong cause or a bare failure. Each is run with a stand-in first in PATH
# that fails the way a fresh or confined machine does:
# - test_dist_netns.sh with an ip whose `netns add` works but `netns exec` fails as in a
#   chroot ("mount --make-rslave /" failed): a skip that says a namespace cannot be entered;
# - test_tb_events.sh with a python3 whose `-m venv` fails as Debian's does without
#   python3-venv: a skip naming python3-venv; and with a venv whose pip cannot reach PyPI: a
#   skip naming PyPI, not python3-venv.
set -u
SRC=${STRATA_SOURCE_DIR:?}
T=$(mktemp -d /tmp/strata-skips-XXXXXX)
trap 'rm -rf "$T"' EXIT
fail=0; checks=0
check() { checks=$((checks+1)); if ! eval "$1"; then echo "FAIL: $2"; fail=$((fail+1)); fi; }

# a chroot's ip: the namespace is made, but entering it remounts /, which is not a mount point
mkdir -p "$T/netns"
cat >"$T/netns/ip" <<'SH'
#!/bin/sh
if [ "$1" = netns ] && [ "$2" = exec ]; then
  echo '"mount --make-rslave /" failed: Invalid argument' >&2; exit 1
fi
exit 0
SH
printf '#!/bin/sh\necho "stand-in mpirun: not to be run" >&2\nexit 1\n' >"$T/netns/mpirun"
chmod 755 "$T/netns/ip" "$T/netns/mpirun"
PATH="$T/netns:$PATH" STRATA_BIN=/bin/false bash "$SRC/tests/test_dist_netns.sh" >"$T/netns.txt" 2>&1
rc=$?
check '[ $rc -eq 77 ]' "dist_netns where ip netns exec fails: exit 77 (skipped), not $rc: $(tail -n 3 "$T/netns.txt")"
check 'grep -q "^SKIP: cannot run a command in a network namespace here (.ip netns exec .* true. failed: \"mount --make-rslave /\" failed: Invalid argument" "$T/netns.txt"' \
  "dist_netns says it cannot enter a namespace, with ip's message: $(tail -n 1 "$T/netns.txt")"

# Debian's python3 without python3-venv
mkdir -p "$T/novenv"
cat >"$T/novenv/python3" <<'SH'
#!/bin/sh
if [ "$1" = -m ] && [ "$2" = venv ]; then
  echo "The virtual environment was not created successfully because ensurepip is not"
  echo "available.  On Debian/Ubuntu systems, you need to install the python3-venv"
  echo "package using the following command."
  exit 1
fi
exit 1
SH
chmod 755 "$T/novenv/python3"
PATH="$T/novenv:$PATH" STRATA_BIN=/bin/false STRATA_TB_VENV="$T/venv1" bash "$SRC/tests/test_tb_events.sh" \
  >"$T/novenv.txt" 2>&1
rc=$?
check '[ $rc -eq 77 ]' "tb_events without python3-venv: exit 77 (skipped), not $rc: $(tail -n 3 "$T/novenv.txt")"
check 'grep -q "^SKIP: python3 -m venv failed .*install python3-venv (tools/setup.sh does)" "$T/novenv.txt"' \
  "tb_events names python3-venv as the cause: $(tail -n 1 "$T/novenv.txt")"
check '! grep -q "PyPI" "$T/novenv.txt"' "tb_events does not blame PyPI for a missing venv module"

# a venv is made, but pip cannot reach PyPI
mkdir -p "$T/nopypi"
cat >"$T/nopypi/python3" <<'SH'
#!/bin/sh
if [ "$1" = -m ] && [ "$2" = venv ]; then
  mkdir -p "$3/bin"
  cat >"$3/bin/python" <<'PY'
#!/bin/sh
if [ "$1" = -m ] && [ "$2" = pip ]; then
  echo "ERROR: Could not find a version that satisfies the requirement tensorboard (from versions: none)"
  echo "ERROR: No matching distribution found for tensorboard"
fi
exit 1
PY
  chmod 755 "$3/bin/python"
  exit 0
fi
exit 1
SH
chmod 755 "$T/nopypi/python3"
PATH="$T/nopypi:$PATH" STRATA_BIN=/bin/false STRATA_TB_VENV="$T/venv2" bash "$SRC/tests/test_tb_events.sh" \
  >"$T/nopypi.txt" 2>&1
rc=$?
check '[ $rc -eq 77 ]' "tb_events without PyPI: exit 77 (skipped), not $rc: $(tail -n 3 "$T/nopypi.txt")"
check 'grep -q "^SKIP: pip could not install the tensorboard package from PyPI" "$T/nopypi.txt" && grep -q "No matching distribution" "$T/nopypi.txt"' \
  "tb_events names PyPI as the cause, with pip's lines: $(tail -n 1 "$T/nopypi.txt")"
check '! grep -q "python3-venv" "$T/nopypi.txt"' "tb_events does not blame python3-venv when PyPI failed"

echo "skip_reasons: $checks checks, $((checks-fail)) passed, $fail failed"
[ $fail -eq 0 ]
