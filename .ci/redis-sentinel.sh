#!/usr/bin/env bash
# A replicated Redis pair watched by three Sentinels, on loopback, for the
# Sentinel and failover tests:
#
#   127.0.0.1:6390         the first primary
#   127.0.0.1:6391         its replica
#   127.0.0.1:26390-26392  three redis-sentinel, quorum 2, master name "dedup"
#
#   .ci/redis-sentinel.sh          start (idempotent: a healthy pair is left alone)
#   .ci/redis-sentinel.sh stop     stop what this script started, remove the dir
#   .ci/redis-sentinel.sh start-node PORT
#                                  start one data node again (after a test's kill -9);
#                                  Sentinel makes it a replica of whichever node is primary
#
# After a failover the primary may be either data node: ask a Sentinel
# (SENTINEL get-master-addr-by-name dedup). No persistence; the files live in
# $DEDUP_SENTINEL_DIR (default ${TMPDIR:-/tmp}/dedup-redis-sentinel).
set -euo pipefail

NODES=(6390 6391)
SENTINELS=(26390 26391 26392)
MASTER=dedup
DIR=${DEDUP_SENTINEL_DIR:-${TMPDIR:-/tmp}/dedup-redis-sentinel}
REDIS_SERVER=${REDIS_SERVER:-redis-server}
REDIS_SENTINEL=${REDIS_SENTINEL:-redis-sentinel}
REDIS_CLI=${REDIS_CLI:-redis-cli}

cli() { timeout 3 "$REDIS_CLI" -h 127.0.0.1 -p "$1" "${@:2}"; }

healthy() {
	local s addr
	for s in "${SENTINELS[@]}"; do
		addr=$(cli "$s" sentinel get-master-addr-by-name "$MASTER" 2>/dev/null | tr '\n' ':') || return 1
		[ -n "$addr" ] || return 1
	done
	local p
	for p in "${NODES[@]}"; do cli "$p" ping 2>/dev/null | grep -q PONG || return 1; done
	# The primary has its replica.
	addr=$(cli "${SENTINELS[0]}" sentinel get-master-addr-by-name "$MASTER" | tail -1)
	cli "$addr" info replication | tr -d '\r' | grep -q ',state=online,'
}

# ours DIR: the pid file's process is still the redis server of DIR, whose
# name is its port. Redis titles itself "redis-server 127.0.0.1:PORT"; the
# port is matched because on a machine restored from a snapshot of /tmp the
# recorded pid may now be another server's.
ours() {
	local pid port
	port=$(basename "$1")
	pid=$(cat "$1/redis.pid" 2>/dev/null) || return 1
	[ -n "$pid" ] && tr '\0' ' ' 2>/dev/null <"/proc/$pid/cmdline" | grep -qE "^redis-(server|sentinel) [^ ]*:$port( |\$)"
}

stop() {
	local d pid
	for d in "$DIR"/*/; do
		[ -d "$d" ] || continue
		ours "$d" || continue
		pid=$(cat "$d/redis.pid")
		kill "$pid" 2>/dev/null || true
		for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
		kill -9 "$pid" 2>/dev/null || true
	done
	rm -rf "$DIR"
}

# node_script PORT [REPLICAOF_PORT]: writes the data node's start.sh.
node_script() {
	local port=$1 of=${2:-} d="$DIR/$1"
	mkdir -p "$d"
	local repl=""
	[ -n "$of" ] && repl="--replicaof 127.0.0.1 $of"
	cat >"$d/start.sh" <<EOF
#!/usr/bin/env bash
# Starts this Redis data node; Sentinel tells it which node to follow.
exec "$REDIS_SERVER" --port $port --bind 127.0.0.1 --protected-mode no --save '' --appendonly no \\
	--repl-diskless-sync-delay 0 --dir "$d" --daemonize yes --pidfile "$d/redis.pid" --logfile "$d/redis.log" $repl
EOF
	chmod +x "$d/start.sh"
}

await_port() {
	local port=$1 i
	for i in $(seq 100); do
		cli "$port" ping >/dev/null 2>&1 && return 0
		sleep 0.1
	done
	echo "redis-sentinel.sh: nothing answers on 127.0.0.1:$port" >&2
	cat "$DIR/$port/redis.log" >&2 || true
	exit 1
}

start() {
	if healthy; then
		echo "redis sentinel: already up (data 127.0.0.1:${NODES[0]},${NODES[1]}; sentinels ${SENTINELS[*]})"
		return 0
	fi
	stop
	local p
	for p in "${NODES[@]}" "${SENTINELS[@]}"; do
		if cli "$p" ping >/dev/null 2>&1; then
			echo "redis sentinel: port $p is taken by a server this script did not start" >&2
			exit 1
		fi
	done
	node_script "${NODES[0]}"
	node_script "${NODES[1]}" "${NODES[0]}"
	bash "$DIR/${NODES[0]}/start.sh"
	bash "$DIR/${NODES[1]}/start.sh"
	await_port "${NODES[0]}"
	await_port "${NODES[1]}"
	for p in "${SENTINELS[@]}"; do
		mkdir -p "$DIR/$p"
		cat >"$DIR/$p/sentinel.conf" <<EOF
port $p
bind 127.0.0.1
protected-mode no
dir $DIR/$p
pidfile $DIR/$p/redis.pid
logfile $DIR/$p/sentinel.log
daemonize yes
sentinel resolve-hostnames no
sentinel monitor $MASTER 127.0.0.1 ${NODES[0]} 2
sentinel down-after-milliseconds $MASTER 1000
sentinel failover-timeout $MASTER 5000
sentinel parallel-syncs $MASTER 1
EOF
		"$REDIS_SENTINEL" "$DIR/$p/sentinel.conf"
	done
	local i
	for i in $(seq 300); do
		healthy && { echo "redis sentinel: up (data 127.0.0.1:${NODES[0]},${NODES[1]}; sentinels ${SENTINELS[*]})"; return 0; }
		sleep 0.1
	done
	echo "redis sentinel: not healthy within 30s" >&2
	tail -20 "$DIR"/*/sentinel.log "$DIR"/*/redis.log >&2 || true
	exit 1
}

case "${1:-start}" in
start) start ;;
stop) stop ;;
start-node)
	[ -x "$DIR/${2:-}/start.sh" ] || { echo "usage: $0 start-node ${NODES[*]}" >&2; exit 2; }
	ours "$DIR/$2" || bash "$DIR/$2/start.sh"
	await_port "$2" ;;
*) echo "usage: $0 [start|stop|start-node PORT]" >&2; exit 2 ;;
esac
