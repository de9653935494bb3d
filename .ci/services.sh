#!/usr/bin/env bash
# Starts every service the tests use, on loopback, idempotently (a service
# that answers is left alone), and installs from Debian what is missing when
# run as root. The README's test command (.ci/test.sh) and .ci/run use it.
#
#   127.0.0.1:6379              redis-server (Debian)
#   127.0.0.1:7000-7002         a 3-master Redis Cluster       (.ci/redis-cluster.sh)
#   127.0.0.1:6390,6391         a Redis primary and replica,
#   127.0.0.1:26390-26392       watched by three redis-sentinel (.ci/redis-sentinel.sh)
#   127.0.0.1:4222              nats-server with JetStream (Debian)
#   127.0.0.1:9092              Apache Kafka 3.9.2, one KRaft node (.ci/kafka.sh)
#   127.0.0.1:19092-19094       Apache Kafka 3.9.2, three KRaft nodes
#   kcat                        a librdkafka client (Debian)
#   prometheus, promtool,       installed only (Debian): the alert tests start
#   prometheus-alertmanager     their own on free loopback ports
#
# Each service's files live under ${TMPDIR:-/tmp}. `.ci/services.sh stop`
# stops what the scripts started.
set -euo pipefail
cd "$(dirname "$0")/.."

log() { printf '[services] %s\n' "$*" >&2; }
answers() { timeout 2 bash -c "exec 3<>/dev/tcp/127.0.0.1/$1" 2>/dev/null; }

run_dir="${TMPDIR:-/tmp}"
if [ "${1:-start}" = stop ]; then
	bash .ci/kafka.sh stop all
	bash .ci/redis-sentinel.sh stop
	bash .ci/redis-cluster.sh stop
	# Redis on 6379 and NATS, by the pids this script recorded, while each is
	# still that server: a machine restored from a snapshot of /tmp has the
	# pid files of processes it never ran.
	for f in "$run_dir/dedup-redis-6379.pid:^redis-server [^ ]*:6379( |\$)" "$run_dir/dedup-nats/nats.pid:^nats-server "; do
		pid=$(cat "${f%%:*}" 2>/dev/null) || continue
		tr '\0' ' ' 2>/dev/null <"/proc/$pid/cmdline" | grep -qE "${f#*:}" && kill "$pid" 2>/dev/null
		rm -f "${f%%:*}"
	done
	exit 0
fi

# What each command comes from in Debian.
declare -A pkg=(
	[redis-server]=redis-server [redis-cli]=redis-tools [redis-sentinel]=redis-sentinel
	[nats-server]=nats-server [kcat]=kcat [openssl]=openssl [java]=openjdk-17-jre-headless
	[mvn]=maven [prometheus]=prometheus [promtool]=prometheus
	[prometheus-alertmanager]=prometheus-alertmanager
)
missing=()
for cmd in "${!pkg[@]}"; do
	command -v "$cmd" >/dev/null 2>&1 || missing+=("${pkg[$cmd]}")
done
if [ ${#missing[@]} -gt 0 ]; then
	if [ "$(id -u)" -ne 0 ]; then
		log "missing commands; as root, run: apt-get install ${missing[*]}"
		exit 1
	fi
	log "installing from Debian: ${missing[*]}"
	apt-get update -qq
	# Without systemd, a package's postinst starts its service through
	# invoke-rc.d (prometheus on every interface's :9090, for one) unless
	# policy-rc.d says no; the tests start what they need themselves.
	policy=/usr/sbin/policy-rc.d
	made_policy=
	if [ ! -e "$policy" ]; then
		printf '#!/bin/sh\nexit 101\n' >"$policy" && chmod +x "$policy" && made_policy=1
	fi
	mapfile -t missing < <(printf '%s\n' "${missing[@]}" | sort -u)
	DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
	if [ -n "$made_policy" ]; then rm -f "$policy"; fi
fi

# The Debian packages enable units that a machine without systemd never
# starts; these services run on their own ports, started here.
if ! answers 6379; then
	log "starting redis-server on 127.0.0.1:6379"
	redis-server --daemonize yes --bind 127.0.0.1 -::1 --port 6379 --save "" --appendonly no \
		--logfile "$run_dir/dedup-redis-6379.log" --pidfile "$run_dir/dedup-redis-6379.pid"
fi

if ! answers 4222; then
	log "starting nats-server with JetStream on 127.0.0.1:4222"
	sd="$run_dir/dedup-nats"
	mkdir -p "$sd"
	setsid nohup nats-server -a 127.0.0.1 -p 4222 -js -sd "$sd" >"$sd/nats.log" 2>&1 </dev/null &
	echo $! >"$sd/nats.pid"
fi

bash .ci/redis-cluster.sh start
bash .ci/redis-sentinel.sh start
bash .ci/kafka.sh start all

for _ in $(seq 1 100); do
	answers 6379 && answers 4222 && break
	sleep 0.1
done
answers 6379 || { log "redis-server did not start on 6379"; exit 1; }
answers 4222 || { log "nats-server did not start on 4222"; cat "$run_dir/dedup-nats/nats.log" >&2; exit 1; }

# nats-server (Debian's 2.9) removes an account's stream directory when its
# last file stream is deleted, and a stream created at that moment fails
# ("could not create storage directory … no such file or directory"); the
# tests create and delete streams in parallel. A one-message file stream
# that nothing touches keeps the directory. Creating it again with the same
# config is a no-op.
anchor_stream() {
	local payload='{"name":"DEDUP_CI_ANCHOR","subjects":["dedup.ci.anchor"],"storage":"file","max_msgs":1}'
	local line
	exec 3<>/dev/tcp/127.0.0.1/4222 || return 1
	read -r -t 5 line <&3 || return 1 # INFO
	printf 'CONNECT {"verbose":false,"pedantic":false}\r\nSUB _INBOX.dedup_ci_anchor 1\r\nPUB $JS.API.STREAM.CREATE.DEDUP_CI_ANCHOR _INBOX.dedup_ci_anchor %d\r\n%s\r\n' \
		"${#payload}" "$payload" >&3
	while read -r -t 5 line <&3; do
		case "$line" in
		MSG*) read -r -t 5 line <&3; exec 3>&-; case "$line" in *'"error"'*) log "anchor stream: $line"; return 1 ;; esac; return 0 ;;
		PING*) printf 'PONG\r\n' >&3 ;;
		-ERR*) log "anchor stream: $line"; exec 3>&-; return 1 ;;
		esac
	done
	exec 3>&-
	return 1
}
anchor_stream || { log "could not create the NATS anchor stream DEDUP_CI_ANCHOR"; exit 1; }
log "all services up"
