#!/usr/bin/env bash
# Apache Kafka in KRaft mode on loopback, from its Maven Central jars, for the
# tests. Two deployments:
#
#   single   one combined broker+controller (node 1) for the default suite:
#              127.0.0.1:9092  PLAINTEXT
#              127.0.0.1:9094  SASL_PLAINTEXT (PLAIN, SCRAM-SHA-256, SCRAM-SHA-512)
#              127.0.0.1:9095  SASL_SSL (SCRAM-SHA-256 over TLS, CA in $DIR/tls/ca.pem)
#              127.0.0.1:9096  CUT, advertised as 127.0.0.1:9097: a test puts a
#                              proxy it can cut on 9097 (clients follow the
#                              advertised address, so every connection crosses it)
#   cluster  three combined nodes (ids 1-3) for rebalance and fault tests:
#              127.0.0.1:19092-19094  PLAINTEXT
#              127.0.0.1:19292-19294  CUT, advertised as 127.0.0.1:19392-19394
#   bench    one combined node for the relay benchmark, never started by the
#            tests, run as a broker is run in production: the JVM's full JIT
#            and G1, a heap of $KAFKA_BENCH_HEAP (default 1g), Kafka's own
#            thread counts and segment size. The test nodes trade all of that
#            for a fast start and little CPU while the tests run; at 2 000
#            msgs/s their C1-only JIT and two request threads keep the broker
#            at 78-95 % of a CPU, which bounds the relays' latency
#            (docs/PERFORMANCE.md, "Latency at 2 000 msgs/s").
#              127.0.0.1:9192  PLAINTEXT
#
#   .ci/kafka.sh start [single|cluster|all|bench]   idempotent: a node that answers is left alone
#   .ci/kafka.sh stop  [single|cluster|all|bench]   stops the nodes this script started, by pid
#   .ci/kafka.sh start-node cluster N          restarts one node (after a test's kill -9)
#
# State lives in $DEDUP_KAFKA_DIR (default ${TMPDIR:-/tmp}/dedup-kafka); each
# node's directory holds server.properties, its log, its pid and start.sh,
# which a fault test runs to bring a killed node back. The jars are copied
# once into .ci/kafka/lib (git-ignored) by Maven from .ci/kafka/pom.xml.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
lib="$root/.ci/kafka/lib"
DIR=${DEDUP_KAFKA_DIR:-${TMPDIR:-/tmp}/dedup-kafka}
HEAP=${KAFKA_HEAP:-512m}
# The test nodes' JVM: a fast start and little CPU (C1 only, serial GC).
JVM_TEST="-Xms128m -Xmx$HEAP -XX:+UseSerialGC -XX:TieredStopAtLevel=1"
JVM_BENCH="-Xms${KAFKA_BENCH_HEAP:-1g} -Xmx${KAFKA_BENCH_HEAP:-1g}"

# Test users of the SASL listeners; internal/testenv names the same ones.
SCRAM256_USER=dedup-scram256 SCRAM256_PASS=dedup-scram256-pw
SCRAM512_USER=dedup-scram512 SCRAM512_PASS=dedup-scram512-pw
PLAIN_USER=dedup-plain PLAIN_PASS=dedup-plain-pw

log() { printf '[kafka.sh] %s\n' "$*" >&2; }

answers() { timeout 2 bash -c "exec 3<>/dev/tcp/127.0.0.1/$1" 2>/dev/null; }

jars() {
	if [ ! -f "$lib/kafka_2.13-3.9.2.jar" ]; then
		command -v mvn >/dev/null || { log "mvn is not installed (apt-get install maven)"; exit 1; }
		log "copying Kafka 3.9.2 jars from Maven Central into $lib"
		mvn -B -q -Dstyle.color=never -f "$root/.ci/kafka/pom.xml" \
			org.apache.maven.plugins:maven-dependency-plugin:3.8.1:copy-dependencies \
			-DincludeScope=runtime -DoutputDirectory="$lib"
	fi
	command -v java >/dev/null || { log "java is not installed (apt-get install openjdk-17-jre-headless)"; exit 1; }
}

# tls makes a CA and a server certificate for 127.0.0.1 once, and a PKCS12
# keystore for the broker.
tls() {
	local d="$DIR/tls"
	[ -f "$d/server.p12" ] && return 0
	mkdir -p "$d"
	openssl req -x509 -newkey rsa:2048 -nodes -days 3650 -subj "/CN=dedupworker test CA" \
		-keyout "$d/ca.key" -out "$d/ca.pem" 2>/dev/null
	openssl req -newkey rsa:2048 -nodes -subj "/CN=127.0.0.1" \
		-keyout "$d/server.key" -out "$d/server.csr" 2>/dev/null
	printf 'subjectAltName=IP:127.0.0.1,DNS:localhost\n' >"$d/san.ext"
	openssl x509 -req -in "$d/server.csr" -CA "$d/ca.pem" -CAkey "$d/ca.key" -CAcreateserial \
		-days 3650 -extfile "$d/san.ext" -out "$d/server.pem" 2>/dev/null
	openssl pkcs12 -export -in "$d/server.pem" -inkey "$d/server.key" -certfile "$d/ca.pem" \
		-passout pass:dedup-test -out "$d/server.p12"
}

# props NODE_DIR ID PLAINTEXT_PORT CONTROLLER_PORT VOTERS CUT_PORT CUT_ADVERTISED RF EXTRA
props() {
	local d=$1 id=$2 port=$3 cport=$4 voters=$5 cut=$6 cutadv=$7 rf=$8 extra=$9
	local listeners="PLAINTEXT://127.0.0.1:$port,CONTROLLER://127.0.0.1:$cport,CUT://127.0.0.1:$cut"
	local advertised="PLAINTEXT://127.0.0.1:$port,CUT://127.0.0.1:$cutadv"
	local protocols="PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT,CUT:PLAINTEXT"
	if [ "$extra" = sasl ]; then
		listeners+=",SASL_PLAINTEXT://127.0.0.1:9094,SASL_SSL://127.0.0.1:9095"
		advertised+=",SASL_PLAINTEXT://127.0.0.1:9094,SASL_SSL://127.0.0.1:9095"
		protocols+=",SASL_PLAINTEXT:SASL_PLAINTEXT,SASL_SSL:SASL_SSL"
	fi
	cat >"$d/server.properties" <<EOF
process.roles=broker,controller
node.id=$id
controller.quorum.voters=$voters
listeners=$listeners
advertised.listeners=$advertised
listener.security.protocol.map=$protocols
controller.listener.names=CONTROLLER
inter.broker.listener.name=PLAINTEXT
log.dirs=$d/data
num.partitions=1
default.replication.factor=$rf
min.insync.replicas=1
offsets.topic.num.partitions=4
offsets.topic.replication.factor=$rf
transaction.state.log.num.partitions=4
transaction.state.log.replication.factor=$rf
transaction.state.log.min.isr=1
group.initial.rebalance.delay.ms=0
broker.session.timeout.ms=3000
broker.heartbeat.interval.ms=500
group.min.session.timeout.ms=500
log.cleaner.dedupe.buffer.size=2097152
log.segment.bytes=16777216
num.network.threads=2
num.io.threads=2
num.recovery.threads.per.data.dir=1
background.threads=2
auto.create.topics.enable=false
delete.topic.enable=true
EOF
	if [ "$extra" = sasl ]; then
		cat >>"$d/server.properties" <<EOF
sasl.enabled.mechanisms=PLAIN,SCRAM-SHA-256,SCRAM-SHA-512
listener.name.sasl_plaintext.plain.sasl.jaas.config=org.apache.kafka.common.security.plain.PlainLoginModule required user_$PLAIN_USER="$PLAIN_PASS";
listener.name.sasl_plaintext.scram-sha-256.sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required;
listener.name.sasl_plaintext.scram-sha-512.sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required;
listener.name.sasl_ssl.sasl.enabled.mechanisms=SCRAM-SHA-256
listener.name.sasl_ssl.scram-sha-256.sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required;
listener.name.sasl_ssl.ssl.keystore.type=PKCS12
listener.name.sasl_ssl.ssl.keystore.location=$DIR/tls/server.p12
listener.name.sasl_ssl.ssl.keystore.password=dedup-test
listener.name.sasl_ssl.ssl.key.password=dedup-test
EOF
	fi
	cat >"$d/log4j.properties" <<EOF
log4j.rootLogger=WARN, file
log4j.logger.kafka=INFO
log4j.logger.kafka.coordinator.group=INFO
log4j.logger.org.apache.kafka=WARN
log4j.appender.file=org.apache.log4j.FileAppender
log4j.appender.file.File=$d/server.log
log4j.appender.file.layout=org.apache.log4j.PatternLayout
log4j.appender.file.layout.ConversionPattern=[%d] %p %m (%c)%n
EOF
}

# setup NODE_DIR ID ... : writes the config, formats storage once, writes start.sh.
# The node's JVM flags are $jvm (JVM_TEST unless the caller sets it).
setup() {
	local d=$1 extra=$9 cluster_id=${10}
	mkdir -p "$d"
	props "$@"
	if [ "$extra" = bench ]; then
		# Kafka's defaults for the request threads, recovery, background
		# work, segments and the cleaner's buffer, as in production.
		sed -i -E '/^(num\.network\.threads|num\.io\.threads|num\.recovery\.threads\.per\.data\.dir|background\.threads|log\.segment\.bytes|log\.cleaner\.dedupe\.buffer\.size)=/d' "$d/server.properties"
	fi
	if [ ! -f "$d/data/meta.properties" ]; then
		local scram=()
		if [ "$extra" = sasl ]; then
			scram=(--add-scram "SCRAM-SHA-256=[name=$SCRAM256_USER,password=$SCRAM256_PASS]"
				--add-scram "SCRAM-SHA-512=[name=$SCRAM512_USER,password=$SCRAM512_PASS]")
		fi
		java -Xmx256m -XX:TieredStopAtLevel=1 -Dlog4j.configuration="file:$d/log4j.properties" -cp "$lib/*" \
			kafka.tools.StorageTool format -t "$cluster_id" -c "$d/server.properties" --ignore-formatted \
			"${scram[@]}" >"$d/format.log" 2>&1 || { cat "$d/format.log" >&2; exit 1; }
	fi
	cat >"$d/start.sh" <<EOF
#!/usr/bin/env bash
# Starts this Kafka node in the background, in a session of its own, and
# records its pid: a fault test kills it by that pid and runs this again.
cd "\$(dirname "\$0")"
setsid nohup java ${jvm:-$JVM_TEST} \\
	-Djava.awt.headless=true -Dlog4j.configuration=file:$d/log4j.properties \\
	-cp '$lib/*' kafka.Kafka server.properties >>stdout.log 2>&1 </dev/null &
echo \$! >pid
EOF
	chmod +x "$d/start.sh"
}

# running NODE_DIR: the pid file names a live Kafka started from NODE_DIR. The
# directory is matched too: on a machine restored from a snapshot of /tmp, the
# recorded pid may now belong to another node, or to anything else.
running() {
	local pid
	pid=$(cat "$1/pid" 2>/dev/null) || return 1
	[ -n "$pid" ] && kill -0 "$pid" 2>/dev/null &&
		tr '\0' ' ' 2>/dev/null <"/proc/$pid/cmdline" | grep -qF -- "file:$1/log4j.properties"
}

# fresh NODE_DIR...: none of the nodes runs, so their state is from a run that
# ended without stopping them (a crash, a snapshot). Test data is disposable:
# start from an empty log rather than recover a quorum that may never form.
fresh() {
	local d
	for d in "$@"; do running "$d" && return 0; done
	for d in "$@"; do rm -rf "$d/data" "$d/pid" "$d/server.log" "$d/stdout.log"; done
}

launch() { # node dir, port
	local d=$1 port=$2
	if answers "$port"; then
		running "$d" || { log "127.0.0.1:$port answers but is not a node this script started"; exit 1; }
		return 0
	fi
	running "$d" && return 0 # started, not yet listening
	bash "$d/start.sh"
}

# await PORT NODE_DIR...: until Metadata on PORT lists every node.
await() {
	local port=$1 want=$2 d=$3 i
	for i in $(seq 1 240); do
		if answers "$port" && [ "$(brokers "$port")" -ge "$want" ]; then return 0; fi
		running "$d" || { log "node in $d exited:"; tail -30 "$d/server.log" "$d/stdout.log" >&2; exit 1; }
		sleep 0.5
	done
	log "kafka on 127.0.0.1:$port not ready after 120s"; tail -30 "$d/server.log" >&2; exit 1
}

brokers() { # number of brokers kcat sees on PORT, or 0
	if command -v kcat >/dev/null; then
		kcat -b "127.0.0.1:$1" -L -m 3 2>/dev/null | grep -cE '^ +broker [0-9]+ at' || true
	else
		echo 99
	fi
}

start_single() {
	jars; tls
	local d="$DIR/single"
	fresh "$d"
	# A running node keeps the files it was started with.
	running "$d" || setup "$d" 1 9092 9093 "1@127.0.0.1:9093" 9096 9097 1 sasl "dedupsingle0000000000A"
	launch "$d" 9092
	await 9092 1 "$d"
	log "single node up on 127.0.0.1:9092 ($d)"
}

cluster_voters="1@127.0.0.1:19192,2@127.0.0.1:19193,3@127.0.0.1:19194"
cluster_node() { # N: setup args for node N
	local n=$1
	echo "$DIR/cluster/node$n $n $((19091 + n)) $((19191 + n)) $cluster_voters $((19291 + n)) $((19391 + n)) 3 - dedupcluster000000000A"
}

start_cluster() {
	jars
	local n
	fresh "$DIR/cluster/node1" "$DIR/cluster/node2" "$DIR/cluster/node3"
	for n in 1 2 3; do
		# shellcheck disable=SC2046
		running "$DIR/cluster/node$n" || setup $(cluster_node "$n")
		launch "$DIR/cluster/node$n" $((19091 + n))
	done
	for n in 1 2 3; do await $((19091 + n)) 3 "$DIR/cluster/node$n"; done
	log "3-node cluster up on 127.0.0.1:19092-19094 ($DIR/cluster)"
}

start_bench() {
	jars
	local d="$DIR/bench"
	fresh "$d"
	running "$d" || jvm=$JVM_BENCH setup "$d" 1 9192 9193 "1@127.0.0.1:9193" 9196 9197 1 bench "dedupbench00000000000A"
	launch "$d" 9192
	await 9192 1 "$d"
	log "bench node up on 127.0.0.1:9192 ($d)"
}

stop_dir() {
	local d=$1 pid
	running "$d" || return 0
	pid=$(cat "$d/pid")
	kill "$pid" 2>/dev/null || true
	for _ in $(seq 1 100); do kill -0 "$pid" 2>/dev/null || return 0; sleep 0.2; done
	kill -9 "$pid" 2>/dev/null || true
}

what=${2:-all}
case "${1:-start}" in
start)
	case $what in
	single) start_single ;;
	cluster) start_cluster ;;
	all) start_single; start_cluster ;;
	bench) start_bench ;;
	*) echo "usage: $0 start [single|cluster|all|bench]" >&2; exit 2 ;;
	esac ;;
stop)
	case $what in
	single) stop_dir "$DIR/single" ;;
	cluster) for n in 1 2 3; do stop_dir "$DIR/cluster/node$n"; done ;;
	all) stop_dir "$DIR/single"; for n in 1 2 3; do stop_dir "$DIR/cluster/node$n"; done ;;
	bench) stop_dir "$DIR/bench" ;;
	esac ;;
start-node)
	[ "$what" = cluster ] && [ -n "${3:-}" ] || { echo "usage: $0 start-node cluster N" >&2; exit 2; }
	launch "$DIR/cluster/node$3" $((19091 + $3)) ;;
*) echo "usage: $0 [start|stop|start-node] ..." >&2; exit 2 ;;
esac
