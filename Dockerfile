# syntax=docker/dockerfile:1
#
# dedupworker: a static binary on distroless, running as the non-root user
# 65532. Build:   docker build -t dedupworker .
# Run:            docker run -v $PWD/config.yaml:/etc/dedupworker/config.yaml dedupworker
# In a container the config's http.addr must be 0.0.0.0:9464 (its default,
# 127.0.0.1:9464, is unreachable from outside); the Helm chart sets it.

FROM --platform=$BUILDPLATFORM golang:1.26 AS build
ARG TARGETOS
ARG TARGETARCH
WORKDIR /src
# Modules first, so a source change reuses the download layer.
COPY go.mod go.sum ./
RUN --mount=type=cache,target=/go/pkg/mod go mod download
COPY . .
RUN --mount=type=cache,target=/go/pkg/mod \
    --mount=type=cache,target=/root/.cache/go-build \
    CGO_ENABLED=0 GOOS=$TARGETOS GOARCH=$TARGETARCH \
    go build -trimpath -buildvcs=false -ldflags="-s -w" -o /out/dedupworker ./cmd/dedupworker

FROM gcr.io/distroless/static-debian12:nonroot
COPY --from=build /out/dedupworker /usr/local/bin/dedupworker
# distroless "nonroot": uid/gid 65532, home /home/nonroot, no shell.
USER 65532:65532
# /metrics, /healthz, /readyz.
EXPOSE 9464
ENTRYPOINT ["/usr/local/bin/dedupworker"]
CMD ["run", "-c", "/etc/dedupworker/config.yaml"]
