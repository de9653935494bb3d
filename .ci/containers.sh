#!/usr/bin/env bash
# Proves the container path of internal/testenv against a real Docker
# engine: the tests get Redis, NATS and one Kafka node from containers that
# testcontainers-go starts, and from nothing else.
#
#   1. installs Debian's docker.io (as root) and starts a dockerd of its own
#      on its own socket, unless one already answers there;
#   2. builds the three images locally with `docker import` (no registry is
#      needed): redis-server and nats-server from Debian with the libraries
#      ldd lists, and Kafka from a JRE plus the jars .ci/kafka.sh uses;
#   3. runs, with DEDUP_TEST_CONTAINERS=only (environment and local servers
#      ignored, every service from a container) and host networking on ports
#      of each container's own, the packages of internal/testenv,
#      idempotency, redisbackend, transports and integration: among them the
#      store conformance suite on the Redis store, both transports' source
#      conformance suites, the Kafka consumer-group tests and the engine's
#      end-to-end tests;
#   4. checks that no container is left, and stops the engine it started.
#
# Containers run with host networking here (DEDUP_TEST_CONTAINER_NETWORK=host)
# so that all traffic stays on loopback; dockerd's default bridge network is
# kept but no container joins it. On a developer's machine the same code
# uses Docker's default bridge networking and mapped ports.
#
# Exits non-zero when a test fails, when a container is left behind, or when
# the engine cannot be started.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
start=$(date +%s)

log() { printf '[containers] %s\n' "$*"; }
die() { log "FAIL: $*"; exit 1; }

STATE=${DEDUP_DOCKER_DIR:-/var/lib/dedup-docker}
SOCK=/run/dedup-docker.sock
export DOCKER_HOST=unix://$SOCK
# The Ryuk reaper's image cannot be pulled here; testenv removes its own
# containers when each test binary ends.
export TESTCONTAINERS_RYUK_DISABLED=true

# --- 1. the engine -----------------------------------------------------------

engine_answers() { timeout 5 docker version >/dev/null 2>&1; }

started_engine=
stop_engine() {
	[ -n "$started_engine" ] || return 0
	local pid
	pid=$(cat "$STATE/dockerd.pid" 2>/dev/null) || return 0
	log "stopping dockerd (pid $pid)"
	kill "$pid" 2>/dev/null || true
	for _ in $(seq 1 100); do
		kill -0 "$pid" 2>/dev/null || break
		sleep 0.2
	done
	if kill -0 "$pid" 2>/dev/null; then
		log "dockerd did not stop within 20s; killing it"
		kill -9 "$pid" 2>/dev/null || true
	fi
	# dockerd leaves the mount of its default network namespace behind.
	if grep -q " $STATE/exec/netns/default " /proc/mounts; then
		umount "$STATE/exec/netns/default" || true
	fi
}
trap stop_engine EXIT

if ! command -v dockerd >/dev/null; then
	[ "$(id -u)" = 0 ] || die "docker.io is not installed and this is not root (apt-get install docker.io)"
	log "installing docker.io"
	DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends docker.io >/dev/null
fi
if engine_answers; then
	log "a Docker engine already answers on $SOCK: using it, leaving it running"
else
	[ "$(id -u)" = 0 ] || die "starting dockerd needs root"
	mkdir -p "$STATE"
	log "starting dockerd on $SOCK (vfs storage, no iptables)"
	# The default bridge network stays: without it testcontainers-go makes
	# a bridge network of its own and attaches every container to it.
	setsid dockerd --host "$DOCKER_HOST" --data-root "$STATE/data" --exec-root "$STATE/exec" \
		--pidfile "$STATE/dockerd.pid" --storage-driver=vfs --iptables=false --ip-masq=false \
		>"$STATE/dockerd.log" 2>&1 </dev/null &
	started_engine=1
	for _ in $(seq 1 150); do
		engine_answers && break
		sleep 0.2
	done
	engine_answers || { tail -20 "$STATE/dockerd.log"; die "dockerd did not answer within 30s"; }
	log "engine started: Docker $(docker version --format '{{.Server.Version}} (API {{.Server.APIVersion}})')"
fi

# --- 2. the images -----------------------------------------------------------

# stage DIR FILE...: copies each file, and every library ldd lists for it,
# under DIR at the same path (a file already there is left as it is).
stage() {
	local dir=$1 f lib
	shift
	for f in "$@"; do
		[ -e "$dir$f" ] || [ -L "$dir$f" ] || cp -L --parents "$f" "$dir"
		for lib in $(ldd "$f" 2>/dev/null | grep -oE '/[^ ]+' || true); do
			[ -e "$dir$lib" ] || cp -L --parents "$lib" "$dir"
		done
	done
}

# import NAME DIR CHANGE...: the image NAME from DIR's files, unless it exists.
import() {
	local name=$1 dir=$2
	shift 2
	local changes=()
	for c in "$@"; do changes+=(--change "$c"); done
	mkdir -p "$dir/tmp" && chmod 1777 "$dir/tmp"
	tar -C "$dir" -c . | docker import "${changes[@]}" - "$name" >/dev/null
	log "image $name built: $(docker image inspect --format '{{.Size}}' "$name" | awk '{printf "%.1f MB", $1/1e6}')"
}

build=$(mktemp -d)
trap 'rm -rf "$build"; stop_engine' EXIT
PATHENV='ENV PATH=/usr/local/bin:/usr/bin:/bin'

command -v redis-server >/dev/null || DEBIAN_FRONTEND=noninteractive apt-get install -y -q redis-server >/dev/null
redis_version=$(redis-server --version | sed -E 's/.* v=([0-9.]+).*/\1/')
export DEDUP_REDIS_IMAGE=dedup-ci/redis:$redis_version
if ! docker image inspect "$DEDUP_REDIS_IMAGE" >/dev/null 2>&1; then
	mkdir -p "$build/redis"
	stage "$build/redis" "$(command -v redis-server)"
	import "$DEDUP_REDIS_IMAGE" "$build/redis" "$PATHENV" 'CMD ["redis-server"]'
fi

command -v nats-server >/dev/null || DEBIAN_FRONTEND=noninteractive apt-get install -y -q nats-server >/dev/null
nats_version=$(nats-server --version | sed -E 's/.*v([0-9.]+).*/\1/')
export DEDUP_NATS_IMAGE=dedup-ci/nats:$nats_version
if ! docker image inspect "$DEDUP_NATS_IMAGE" >/dev/null 2>&1; then
	mkdir -p "$build/nats"
	stage "$build/nats" "$(command -v nats-server)"
	ln -s "$(command -v nats-server)" "$build/nats/nats-server"
	# As the official image: the server is /nats-server, the entrypoint.
	import "$DEDUP_NATS_IMAGE" "$build/nats" "$PATHENV" 'ENTRYPOINT ["/nats-server"]'
fi

# Kafka: the jars .ci/kafka.sh copies from Maven Central, a JRE, bash for
# the start script, and the script itself, at the official image's path
# (/etc/kafka/docker/run): it turns KAFKA_* variables into
# server.properties as that image does, formats the log directory and runs
# the broker.
if [ ! -f .ci/kafka/lib/kafka_2.13-3.9.2.jar ]; then
	command -v mvn >/dev/null || DEBIAN_FRONTEND=noninteractive apt-get install -y -q maven >/dev/null
	log "copying the Kafka jars from Maven Central into .ci/kafka/lib"
	mvn -B -q -Dstyle.color=never -f .ci/kafka/pom.xml \
		org.apache.maven.plugins:maven-dependency-plugin:3.8.1:copy-dependencies \
		-DincludeScope=runtime -DoutputDirectory="$root/.ci/kafka/lib" 2>&1 | sed 's/\x1b\[[0-9;]*m//g'
fi
command -v java >/dev/null || DEBIAN_FRONTEND=noninteractive apt-get install -y -q openjdk-17-jre-headless >/dev/null
kafka_version=$(ls .ci/kafka/lib | sed -nE 's/^kafka_2\.13-([0-9.]+)\.jar$/\1/p')
export DEDUP_KAFKA_IMAGE=dedup-ci/kafka:$kafka_version
if ! docker image inspect "$DEDUP_KAFKA_IMAGE" >/dev/null 2>&1; then
	d=$build/kafka
	java_home=$(dirname "$(dirname "$(readlink -f "$(command -v java)")")")
	mkdir -p "$d/opt/kafka/libs" "$d/opt/kafka/config" "$d/etc/kafka/docker" "$d/bin"
	cp .ci/kafka/lib/*.jar "$d/opt/kafka/libs/"
	# The JRE's conf and security files are links into /etc.
	tar -C / -c "${java_home#/}" $(cd / && ls -d etc/java-*-openjdk 2>/dev/null) | tar -C "$d" -x
	stage "$d" "$(command -v bash)" "$java_home/bin/java" $(find "$java_home/lib" -name '*.so' -type f)
	ln -sf "$java_home/bin/java" "$d/bin/java"
	[ -e "$d/bin/bash" ] || ln -s "$(command -v bash)" "$d/bin/bash"
	cat >"$d/opt/kafka/config/log4j.properties" <<'EOF'
log4j.rootLogger=WARN, stdout
log4j.logger.kafka=INFO
log4j.appender.stdout=org.apache.log4j.ConsoleAppender
log4j.appender.stdout.layout=org.apache.log4j.PatternLayout
log4j.appender.stdout.layout.ConversionPattern=[%d] %p %m (%c)%n
EOF
	cat >"$d/etc/kafka/docker/run" <<'EOF'
#!/bin/bash
# KAFKA_FOO_BAR=v becomes foo.bar=v (___ is -, __ is _), as in the official
# apache/kafka image; the JVM's own variables are not broker settings.
set -e
props=/opt/kafka/config/server.properties
: >"$props"
for name in $(compgen -e); do
	case $name in
	KAFKA_HEAP_OPTS | KAFKA_OPTS | KAFKA_JVM_PERFORMANCE_OPTS | KAFKA_LOG4J_OPTS | KAFKA_JMX_OPTS | KAFKA_GC_LOG_OPTS | KAFKA_VERSION) ;;
	KAFKA_*)
		key=${name#KAFKA_}
		key=${key,,}
		key=${key//___/-}
		key=${key//__/@}
		key=${key//_/.}
		key=${key//@/_}
		printf '%s=%s\n' "$key" "${!name}" >>"$props"
		;;
	esac
done
cp="/opt/kafka/libs/*"
log4j=-Dlog4j.configuration=file:/opt/kafka/config/log4j.properties
java -Xmx256m -XX:TieredStopAtLevel=1 "$log4j" -cp "$cp" kafka.tools.StorageTool format \
	-t "${CLUSTER_ID:?CLUSTER_ID is not set}" -c "$props" --ignore-formatted
exec java ${KAFKA_HEAP_OPTS:--Xmx512m} $KAFKA_JVM_PERFORMANCE_OPTS $KAFKA_OPTS "$log4j" \
	-Djava.awt.headless=true -cp "$cp" kafka.Kafka "$props"
EOF
	chmod +x "$d/etc/kafka/docker/run"
	import "$DEDUP_KAFKA_IMAGE" "$d" "$PATHENV" 'CMD ["/etc/kafka/docker/run"]'
fi

# --- 3. the tests, through containers only -----------------------------------

# Under "only" a container that cannot be started fails its tests, and the
# topologies containers do not provide (Cluster, Sentinel, 3-node Kafka)
# skip, naming what they need; DEDUP_REQUIRE_SERVICES=1, which .ci/run sets
# for the main run, would fail those instead.
unset DEDUP_REQUIRE_SERVICES
export DEDUP_TEST_CONTAINERS=only
export DEDUP_TEST_CONTAINER_NETWORK=host
export GOFLAGS="${GOFLAGS:-} -count=1"
status=0

# run PACKAGE...: go test -race -v through containers only, then each
# package's counts of top-level tests (subtests in brackets) and the reason
# of every skip.
run() {
	local out=$build/test.out t0
	t0=$(date +%s)
	log "go test -race $*"
	go test -race -v "$@" >"$out" 2>&1 || status=1
	awk -v secs=$(($(date +%s) - t0)) '
		/^ *[A-Za-z0-9_]+\.go:[0-9]+: / { last = $0; sub(/^ *[A-Za-z0-9_]+\.go:[0-9]+: /, "", last) }
		/^--- PASS/ { p++ } /^--- FAIL/ { f++ } /^--- SKIP/ { s++ }
		/^ +--- PASS/ { sp++ } /^ +--- FAIL/ { sf++ } /^ +--- SKIP/ { ss++ }
		/^ *--- SKIP/ { why[last]++ }
		/^(ok|FAIL)[ \t]+github\.com\// {
			printf "  %-4s %-60s %4d passed [%d], %d failed [%d], %d skipped [%d]\n", $1, $2, p, sp, f, sf, s, ss
			tp += p; tf += f; ts += s; tsp += sp; tsf += sf; tss += ss
			p = f = s = sp = sf = ss = 0
		}
		END {
			printf "  total: %d tests passed [%d subtests], %d failed [%d], %d skipped [%d], in %ds\n", tp, tsp, tf, tsf, ts, tss, secs
			for (r in why) printf "  skipped x%d: %s\n", why[r], r
		}' "$out"
	if [ $status != 0 ]; then
		grep -E -B2 -A20 '^\s*--- FAIL|^FAIL|panic:' "$out" | head -200
	fi
}

run ./internal/testenv/ ./idempotency/... ./redisbackend/... ./transports/... ./integration/

# --- 4. nothing left ---------------------------------------------------------

# Each test binary's containers are removed as it exits; give the removal
# of the last one a moment.
left=
for _ in $(seq 1 50); do
	left=$(docker ps -aq)
	[ -z "$left" ] && break
	sleep 0.2
done
if [ -n "$left" ]; then
	docker ps -a
	die "containers left behind"
fi
log "no container left"
# No container joined a network: testcontainers-go made none of its own,
# and the default bridge has no member.
nets=$(docker network ls --format '{{.Name}}' | sort | tr '\n' ' ')
[ "$nets" = "bridge host none " ] || die "networks other than Docker's defaults exist: $nets"
members=$(docker network inspect bridge --format '{{len .Containers}}')
[ "$members" = 0 ] || die "$members containers on the default bridge network"
log "no network but Docker's defaults, none with a container"
stop_engine
started_engine=
if [ $status = 0 ]; then
	log "passed in $(($(date +%s) - start))s"
else
	log "FAILED after $(($(date +%s) - start))s"
fi
exit $status
