#!/usr/bin/env bash
# test_run_setup.sh - tools/setup.sh as a user who is not root and has no sudo (a fresh
# Debian 12 account): it must not die on "sudo: command not found" (exit 127) but say what
# is missing and print the exact apt-get line to run as root, exiting 1; that line holds
# python3-venv (test_tb_events.sh's venv). With everything installed it says so in one line
# and exits 0. The user is nobody (setpriv); the PATH holds a fake dpkg-query that reports
# nothing (then everything) installed, and no sudo. Skipped (77) where no unprivileged user
# can be made.
set -u
SRC=${STRATA_SOURCE_DIR:?}
T=$(mktemp -d /tmp/strata-setup-XXXXXX)
chmod 755 "$T"
fail=0; checks=0
check() { checks=$((checks+1)); if ! eval "$1"; then echo "FAIL: $2"; fail=$((fail+1)); fi; }
if [ "$(id -u)" -eq 0 ]; then
  command -v setpriv >/dev/null || { echo "root without setpriv: cannot become another user; skipped"; exit 77; }
  as_user() { setpriv --reuid=65534 --regid=65534 --clear-groups "$@"; }
else
  as_user() { "$@"; } # already not root
fi
mkdir -p "$T/bin"
printf '#!/bin/bash\nexit 1\n' >"$T/bin/dpkg-query" # nothing is installed
chmod 755 "$T/bin/dpkg-query"
for tool in grep id; do ln -s "$(command -v $tool)" "$T/bin/$tool"; done
cp "$SRC/tools/setup.sh" "$T/setup.sh" && chmod 755 "$T/setup.sh"
as_user /usr/bin/env -i PATH="$T/bin" /bin/bash "$T/setup.sh" >"$T/out.txt" 2>&1
rc=$?
grep -q "not root" "$T/out.txt" || as_user /bin/true || { echo "cannot run as uid 65534; skipped"; exit 77; }
check '[ $rc -eq 1 ]' "exit status 1, not $rc: $(cat "$T/out.txt")"
check '! grep -q "command not found" "$T/out.txt"' "no 'command not found'"
check 'grep -q "not root and has no sudo" "$T/out.txt"' "says why it cannot install"
check 'grep -qx "  apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y build-essential cmake .*jq.*" "$T/out.txt"' \
  "prints the apt-get line to run as root: $(tail -1 "$T/out.txt")"
check 'grep -qx "  apt-get update && .* python3-venv\( .*\)\?" "$T/out.txt"' \
  "the line installs python3-venv, which test_tb_events.sh's venv needs: $(tail -1 "$T/out.txt")"

# everything installed: one line saying how many packages it checked, exit 0
printf '#!/bin/bash\nprintf "install ok installed"\n' >"$T/bin/dpkg-query"
as_user /usr/bin/env -i PATH="$T/bin" /bin/bash "$T/setup.sh" >"$T/out2.txt" 2>&1
rc=$?
n=$(bash -c 'source <(sed -n "/^pkgs=/,/^missing=/p" "$1"); echo ${#pkgs[@]}' _ "$SRC/tools/setup.sh")
check '[ $rc -eq 0 ]' "nothing missing: exit status 0, not $rc: $(cat "$T/out2.txt")"
check '[ "$(wc -l < "$T/out2.txt")" -eq 1 ] && grep -q "^strata setup: all $n Debian packages .* are installed (build-essential .*); nothing to do$" "$T/out2.txt"' \
  "nothing missing: one line naming the $n packages checked, all present (got: '$(cat "$T/out2.txt")')"
echo "run_setup: $checks checks, $((checks-fail)) passed, $fail failed"
[ $fail -eq 0 ] && rm -rf "$T"
[ $fail -eq 0 ]
