# The retrysafe gateway image: one static binary on an empty base, run as 65532:65532.
#
#   docker build --build-arg VERSION=v0.1.0 -t ghcr.io/retrysafe/retrysafe:v0.1.0 .
#   docker run --rm -p 8080:8080 -p 9090:9090 -v retrysafe-data:/data \
#       -e RETRYSAFE_UPSTREAM=http://api:3000 ghcr.io/retrysafe/retrysafe:v0.1.0
#
# deploy/image builds the same image without a container engine, from this file: it
# reads the final stage and the stages it copies from, and refuses any instruction it
# does not interpret, so that this file and the image it builds cannot drift apart.
# Keep to what it knows (see deploy/image/doc.go) or teach it the new instruction.

# The Go toolchain runs on the build machine's platform and cross-compiles for the
# target's: the binary is static (CGO_ENABLED=0; the SQLite store is pure Go).
FROM --platform=$BUILDPLATFORM golang:1.26.8-bookworm AS build
ARG TARGETOS
ARG TARGETARCH
# VERSION is the release the binary reports; empty for a build from a work tree.
ARG VERSION=""
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
RUN CGO_ENABLED=0 GOOS=$TARGETOS GOARCH=$TARGETARCH go build -trimpath -ldflags "-s -w -X main.releaseVersion=${VERSION}" -o /out/retrysafe ./cmd/retrysafe

# What the empty base lacks: the CA bundle, for https:// upstreams and TLS to the
# stores; /data, the volume the SQLite store writes, owned by the user the gateway runs
# as (a new named volume takes the owner of the image's directory); /tmp, where SQLite
# may spill temporary files.
FROM --platform=$BUILDPLATFORM golang:1.26.8-bookworm AS rootfs
RUN mkdir -p /rootfs/etc/ssl/certs /rootfs/data /rootfs/tmp && cp /etc/ssl/certs/ca-certificates.crt /rootfs/etc/ssl/certs/ca-certificates.crt && chown 65532:65532 /rootfs/data && chmod 0755 /rootfs/data && chmod 1777 /rootfs/tmp

FROM scratch
ARG VERSION=""
# Stage copies keep the owners and modes set above.
COPY --from=rootfs /rootfs/ /
COPY --from=build /out/retrysafe /retrysafe
# Numeric: the empty base has no /etc/passwd to look a name up in.
USER 65532:65532
WORKDIR /data
# The admin listener (/healthz, /readyz, /metrics) listens on all interfaces for the
# probes; the operator console, which can evict keys, is off: to serve it, set
# RETRYSAFE_CONSOLE=on (or read-only) and RETRYSAFE_ADMIN_TOKEN, which the gateway then
# requires of it and of /metrics.
ENV RETRYSAFE_LISTEN=:8080 RETRYSAFE_ADMIN=:9090 RETRYSAFE_STORE=sqlite:/data/retrysafe.db RETRYSAFE_CONSOLE=off
EXPOSE 8080 9090
VOLUME /data
# The gateway drains on SIGTERM: it finishes and records the requests in flight.
STOPSIGNAL SIGTERM
LABEL org.opencontainers.image.title="retrysafe" \
      org.opencontainers.image.description="retrysafe gateway: a reverse proxy that gives any HTTP API Idempotency-Key semantics" \
      org.opencontainers.image.source="https://github.com/retrysafe/retrysafe" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.version="${VERSION}"
ENTRYPOINT ["/retrysafe"]
CMD ["gateway"]
