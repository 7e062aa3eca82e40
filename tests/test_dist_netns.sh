#!/usr/bin/env bash
# test_dist_netns.sh - data parallel between two "machines": two network namespaces made
# here, joined by a veth pair, each with its own address. mpirun starts in the first and
# reaches the second through an rsh agent that enters it (`ip netns exec`), as it would
# reach another host with ssh; OpenMPI's TCP transport only (shared memory disabled), so
# every byte between the ranks crosses the network path between hosts. ZeRO 1 at 2 ranks
# equals one process with grad_accum 2 bit for bit (losses and final weights), and the
# bytes each rank sent are the stage's volume.
# Skips (77) where mpirun is missing or namespaces cannot be made or entered (no root, no
# ip, a chroot); test_skip_reasons.sh checks that skip with a stand-in ip.
set -u
S=${STRATA_BIN:?STRATA_BIN not set}
command -v mpirun >/dev/null || { echo "SKIP: mpirun not found (apt-get install openmpi-bin libopenmpi-dev)"; exit 77; }
command -v ip >/dev/null || { echo "SKIP: ip not found (apt-get install iproute2)"; exit 77; }
. "$(dirname "$0")/mpi_sanitized.sh" # OpenMPI's own leaks, under the sanitizers
T=$(mktemp -d /tmp/strata-test-netns-XXXXXX)
id=$$
A_NS=strata-a-$id B_NS=strata-b-$id VA=sta$id VB=stb$id
NET=10.$((200 + id % 50)).$((id / 50 % 250)).
cleanup() { ip netns del "$A_NS" 2>/dev/null; ip netns del "$B_NS" 2>/dev/null; rm -rf "$T"; }
trap cleanup EXIT
if ! ip netns add "$A_NS" 2>"$T/ns.err"; then
  echo "SKIP: cannot make a network namespace here: $(cat "$T/ns.err")"; exit 77
fi
# what the test does with it: run a command inside (ip remounts / and /sys there, which fails
# in a chroot or wherever / is not a mount point, after the add succeeded)
if ! ip netns exec "$A_NS" true 2>"$T/ns.err"; then
  echo "SKIP: cannot run a command in a network namespace here ('ip netns exec $A_NS true' failed:" \
       "$(tr '\n' ' ' <"$T/ns.err" | sed 's/ *$//')); a chroot, or a system whose / is not a mount point, cannot enter one:" \
       "run it on a system whose / is a mount point, as root"
  exit 77
fi
set -e
ip netns add "$B_NS"
ip link add "$VA" type veth peer name "$VB"
ip link set "$VA" netns "$A_NS"
ip link set "$VB" netns "$B_NS"
ip -n "$A_NS" addr add "${NET}1/24" dev "$VA"
ip -n "$B_NS" addr add "${NET}2/24" dev "$VB"
for ns in "$A_NS" "$B_NS"; do ip -n "$ns" link set lo up; done
ip -n "$A_NS" link set "$VA" up
ip -n "$B_NS" link set "$VB" up
set +e
# the "ssh" of these two hosts: enter the namespace that holds the address
cat >"$T/agent.sh" <<EOF
#!/bin/sh
while [ "\${1#-}" != "\$1" ]; do shift; done
host=\$1; shift
case \$host in ${NET}1) ns=$A_NS;; ${NET}2) ns=$B_NS;; *) echo "agent: unknown host \$host" >&2; exit 1;; esac
exec ip netns exec \$ns sh -c "\$*"
EOF
chmod +x "$T/agent.sh"
fail=0
A="--model gpt2-tiny --n_embd 128 --n_layer 2 --vocab_size 256 --max_seq 32 --batch 2 --seq 32 --steps 8
   --warmup_steps 2 --eval_every 0 --sample_every 0 --threads 1 --quiet 1 --grad_clip 0.5"
"$S" train $A --grad_accum 2 --run_dir "$T/ref" >"$T/ref.out" 2>&1 || { echo "FAIL: one process: $(tail -3 "$T/ref.out")"; exit 1; }
timeout 120 ip netns exec "$A_NS" mpirun --allow-run-as-root --oversubscribe --bind-to none \
  --mca plm_rsh_agent "$T/agent.sh" --host "${NET}1,${NET}2" -np 2 \
  --mca btl tcp,self --mca btl_tcp_if_include "${NET}0/24" --mca oob_tcp_if_include "${NET}0/24" \
  "$S" train $A --zero 1 --run_dir "$T/two" >"$T/two.out" 2>&1
rc=$?
if [ $rc -ne 0 ]; then echo "FAIL: 2 ranks over TCP between namespaces: rc $rc:"; tail -15 "$T/two.out"; exit 1; fi
losses() { jq -c '[.step, .loss, .grad_norm]' "$1/metrics.jsonl"; }
if ! cmp -s <(losses "$T/ref") <(losses "$T/two"); then
  echo "FAIL: losses over TCP differ from one process with grad_accum 2:"; diff <(losses "$T/ref") <(losses "$T/two") | head; fail=1
fi
if ! cmp -s "$T/ref/checkpoints/step_00000008/model.safetensors" "$T/two/checkpoints/step_00000008/model.safetensors"; then
  echo "FAIL: final weights over TCP differ from one process's"; fail=1
fi
# the ranks' bytes: a reduce-scatter of the gradient and an all-gather of the weights, each
# (N-1)/N of 4 bytes a parameter sent, plus the small collectives (under 1%)
np=$(jq -s '.[0].comm_sent_bytes' "$T/two/metrics.jsonl")
params=$(jq .n_params "$T/two/checkpoints/step_00000008/shards.json")
if ! awk -v b="$np" -v p="$params" 'BEGIN { t = 4 * p; exit !(b >= t && b <= 1.001 * t) }'; then
  echo "FAIL: rank 0 sent $np bytes a step; the ZeRO 1 volume for $params parameters is $((4 * params))"; fail=1
fi
[ $fail -eq 0 ] && echo "PASS: ZeRO 1 over TCP between two network namespaces equals one process (grad_accum 2); $np bytes a step a rank"
exit $fail
