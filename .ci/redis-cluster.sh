#!/usr/bin/env bash
# Starts a throwaway 3-master Redis Cluster on 127.0.0.1:7000-7002 for the
# cluster tests of redisbackend (internal/testenv finds it there), or stops it.
#
#   .ci/redis-cluster.sh          start (idempotent: a healthy cluster is left alone)
#   .ci/redis-cluster.sh stop     stop the nodes this script started, remove the dir
#
# No persistence (no RDB, no AOF); the nodes' files live in $DEDUP_CLUSTER_DIR
# (default ${TMPDIR:-/tmp}/dedup-redis-cluster). Needs redis-server and
# redis-cli 7 (cluster support in redis-cli).
set -euo pipefail

PORTS=(7000 7001 7002)
DIR=${DEDUP_CLUSTER_DIR:-${TMPDIR:-/tmp}/dedup-redis-cluster}
REDIS_SERVER=${REDIS_SERVER:-redis-server}
REDIS_CLI=${REDIS_CLI:-redis-cli}

cli() { "$REDIS_CLI" -h 127.0.0.1 -p "$1" "${@:2}"; }

cluster_ok() {
  local port
  for port in "${PORTS[@]}"; do
    cli "$port" cluster info 2>/dev/null | tr -d '\r' | grep -qx 'cluster_state:ok' || return 1
  done
}

stop() {
  local port pid
  for port in "${PORTS[@]}"; do
    [ -f "$DIR/$port/redis.pid" ] || continue
    pid=$(cat "$DIR/$port/redis.pid")
    # Only a pid this script recorded, and only while it is still the
    # redis-server of that port: on a machine restored from a snapshot of
    # /tmp the pid may now be another server's.
    if [ -n "$pid" ] && tr '\0' ' ' 2>/dev/null <"/proc/$pid/cmdline" | grep -qE "^redis-server [^ ]*:$port( |\$)"; then
      cli "$port" shutdown nosave >/dev/null 2>&1 || kill "$pid" 2>/dev/null || true
      for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    fi
  done
  rm -rf "$DIR"
}

start() {
  if cluster_ok; then
    echo "redis cluster: already up on 127.0.0.1:${PORTS[0]}-${PORTS[-1]}"
    return 0
  fi
  # A half-made cluster from an earlier run (ours): start over.
  stop
  local port
  for port in "${PORTS[@]}"; do
    if cli "$port" ping >/dev/null 2>&1; then
      echo "redis cluster: port $port is taken by a server this script did not start" >&2
      exit 1
    fi
    mkdir -p "$DIR/$port"
    "$REDIS_SERVER" --port "$port" --bind 127.0.0.1 --protected-mode no \
      --cluster-enabled yes --cluster-config-file "$DIR/$port/nodes.conf" \
      --cluster-node-timeout 5000 --appendonly no --save '' \
      --dir "$DIR/$port" --daemonize yes --pidfile "$DIR/$port/redis.pid" \
      --logfile "$DIR/$port/redis.log"
  done
  for port in "${PORTS[@]}"; do
    for i in $(seq 100); do
      cli "$port" ping >/dev/null 2>&1 && break
      [ "$i" = 100 ] && { echo "redis cluster: node $port did not start" >&2; cat "$DIR/$port/redis.log" >&2; exit 1; }
      sleep 0.1
    done
  done
  local addrs=()
  for port in "${PORTS[@]}"; do addrs+=("127.0.0.1:$port"); done
  "$REDIS_CLI" --cluster create "${addrs[@]}" --cluster-replicas 0 --cluster-yes >"$DIR/create.log" 2>&1 ||
    { cat "$DIR/create.log" >&2; exit 1; }
  for i in $(seq 200); do
    cluster_ok && { echo "redis cluster: up on 127.0.0.1:${PORTS[0]}-${PORTS[-1]} ($DIR)"; return 0; }
    sleep 0.1
  done
  echo "redis cluster: cluster_state did not become ok within 20s" >&2
  cli "${PORTS[0]}" cluster info >&2 || true
  exit 1
}

case "${1:-start}" in
  start) start ;;
  stop) stop ;;
  *) echo "usage: $0 [start|stop]" >&2; exit 2 ;;
esac
