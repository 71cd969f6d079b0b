#!/usr/bin/env bash
# Run the frozen-broker exactly-once scenarios (issue 24) in their external-cluster mode against a
# three-broker dev cluster that this script starts as a process of its own, the way they would run
# against a real Liftbridge deployment (LIFTBRIDGE_TEST_BROKERS + --freeze-cmd/--thaw-cmd).
#
#   scripts/frozen_external.sh control   # freeze one broker through the dev server's control channel
#   scripts/frozen_external.sh sigstop   # freeze the whole server process with SIGSTOP (every broker)
#
# The dev server runs every broker in one process, so it cannot be frozen one broker at a time by a
# signal: "control" freezes one broker through `--control stdin` (a FIFO here; the dev server's model
# of SIGSTOP), "sigstop" freezes the real process with a real signal (all three brokers at once, so
# the roles differ only in the client's first broker). Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
mode="${1:-control}"
shift || true
python="${PYTHON:-python}"
dir="$(mktemp -d)"
server_pid=""
cleanup() {
    exec 3>&- 2>/dev/null || true
    if [[ -n "$server_pid" ]]; then
        kill -CONT "$server_pid" 2>/dev/null || true
        kill -TERM "$server_pid" 2>/dev/null || true
        wait "$server_pid" 2>/dev/null || true
    fi
    rm -rf "$dir"
}
trap cleanup EXIT
mkfifo "$dir/control"
# The fault suite's dev cluster timings: a frozen partition leader is replaced after 1.5 s, the
# metadata leader after 0.2 s.
"$python" -m airflow_provider_liftbridge.devserver --brokers 3 --port 0 --nats-port 0 --control stdin \
    --replica-max-lag-time 6 --replica-max-leader-timeout 1.5 --metadata-election-timeout 0.2 \
    <"$dir/control" >"$dir/out" 2>"$dir/err" &
server_pid=$!
exec 3>"$dir/control" # keeps the control channel open between commands
for _ in $(seq 300); do
    grep -q '^liftbridge-devserver ready' "$dir/out" && break
    kill -0 "$server_pid" 2>/dev/null || { cat "$dir/err" >&2; exit 1; }
    sleep 0.1
done
ready="$(grep '^liftbridge-devserver ready' "$dir/out")"
brokers="$(sed -E 's/.* grpc=([^ ]+).*/\1/' <<<"$ready")"
nats="$(sed -E 's/.* nats=([^ ]+).*/\1/' <<<"$ready")"
echo "dev cluster pid $server_pid: $ready" >&2

# ctl COMMAND: send one control command and wait for the server's "ok COMMAND" answer.
cat >"$dir/ctl" <<EOF
#!/usr/bin/env bash
set -eu
before=\$(grep -cxF "ok \$*" "$dir/out" || true)
echo "\$*" >"$dir/control"
for _ in \$(seq 500); do
    [[ \$(grep -cxF "ok \$*" "$dir/out" || true) -gt \$before ]] && exit 0
    grep -q "^error \$*" "$dir/out" && { grep "^error \$*" "$dir/out" >&2; exit 1; }
    sleep 0.01
done
echo "no answer to '\$*'" >&2; exit 1
EOF
chmod +x "$dir/ctl"

case "$mode" in
control)
    # Broker 0 is the metadata leader when the cluster starts; a frozen one loses it after 0.2 s, so
    # the thaw hands it back (a real deployment would rather use --metadata-leader-cmd).
    freeze="$dir/ctl stall {index}"
    thaw="$dir/ctl resume {index} && $dir/ctl metadata-leader 0"
    ;;
sigstop)
    freeze="kill -STOP $server_pid"
    thaw="kill -CONT $server_pid"
    ;;
*)
    echo "usage: $0 control|sigstop [pytest arguments]" >&2
    exit 2
    ;;
esac

LIFTBRIDGE_TEST_BROKERS="$brokers" LIFTBRIDGE_TEST_NATS="$nats" LIFTBRIDGE_TEST_METADATA_LEADER=0 \
    LIFTBRIDGE_TEST_FREEZE_CMD="$freeze" LIFTBRIDGE_TEST_THAW_CMD="$thaw" \
    "$python" -m pytest -p no:cacheprovider -q -rs tests/reliability/test_exactly_once_frozen.py "$@"
