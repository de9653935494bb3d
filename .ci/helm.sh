#!/usr/bin/env bash
# Make sure a helm binary is available for the chart tests under deploy/helm
# and print its path. Helm is built from its Go module (through the Go module
# proxy) into .ci/bin/, which git ignores; a later run finds it and builds
# nothing. HELM_VERSION overrides the pinned version.
#
#   bash .ci/helm.sh            # prints /path/to/repo/.ci/bin/helm
#   HELM=$(bash .ci/helm.sh) go test ./deploy/...
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)

# v3.22.0 is the newest Helm 3 release and builds with Go 1.26. Like helm's
# own Makefile, tell it the Kubernetes version of its client-go (v0.37 ->
# 1.37): without it helm assumes v1.20 and refuses charts needing newer.
version="${HELM_VERSION:-v3.22.0}"
kube_major=1
kube_minor="${HELM_KUBE_MINOR:-37}"
bin="$root/.ci/bin"
helm="$bin/helm"
# What the binary was built as; a different version or flags rebuild it.
stamp="$bin/helm.stamp"
want="${version} kube ${kube_major}.${kube_minor}"

log() { printf '[helm.sh] %s\n' "$*" >&2; }

if [ -x "$helm" ] && [ "$(cat "$stamp" 2>/dev/null)" = "$want" ] && "$helm" version --short >/dev/null 2>&1; then
	echo "$helm"
	exit 0
fi

mkdir -p "$bin"
log "building helm ${version} into ${bin} (go install; several minutes on a cold module cache)"
start=$(date +%s)
# Outside the repo's module so its go.mod is neither read nor changed.
(cd "$bin" && GOFLAGS=-mod=mod GOBIN="$bin" CGO_ENABLED=0 \
	go install -trimpath -ldflags "-s -w -X helm.sh/helm/v3/internal/version.version=${version} \
		-X helm.sh/helm/v3/pkg/chartutil.k8sVersionMajor=${kube_major} -X helm.sh/helm/v3/pkg/chartutil.k8sVersionMinor=${kube_minor} \
		-X helm.sh/helm/v3/pkg/lint/rules.k8sVersionMajor=${kube_major} -X helm.sh/helm/v3/pkg/lint/rules.k8sVersionMinor=${kube_minor}" \
	"helm.sh/helm/v3/cmd/helm@${version}")
echo "$want" >"$stamp"
log "built $("$helm" version --short) in $(($(date +%s) - start))s"
echo "$helm"
