# syntax=docker/dockerfile:1
#
# The echomq-sidecar image: one statically linked binary on an empty base
# (FROM scratch), plus the CA bundle (for rediss:// and TLS endpoints) and
# passwd/group entries for the non-root user 65532 it runs as. About 19 MB unpacked
# (scripts/image reports the size): the binary is built with Cargo.toml's dist
# profile, which keeps it under the image's 20 MB budget.
#
#   docker build -t echomq-sidecar:0.1.0 .
#   docker run --rm -e ECHOMQ_REDIS_URL=redis://redis:6379 echomq-sidecar:0.1.0
#
# Where there is no Docker engine and no image registry (FROM needs one),
# scripts/image builds the same image with Debian's buildah: it runs the build
# stage's cargo command on the host and assembles the final stage FROM scratch
# from its binary. See that script for what it verifies.

ARG RUST_VERSION=1.95
ARG DEBIAN_RELEASE=bookworm

# --- build: the static binary, and the few files the final image needs --------
FROM docker.io/library/rust:${RUST_VERSION}-${DEBIAN_RELEASE} AS build
WORKDIR /src
# glibc linked statically: nothing to load at run time, so the binary runs on an
# empty filesystem (glibc >= 2.34 has the `files` and `dns` name services built
# in, so host names still resolve through /etc/hosts and /etc/resolv.conf,
# which the container runtime provides).
# Relative relocations packed (DT_RELR), as .cargo/config.toml says, which
# RUSTFLAGS replaces: less to read and apply at start, less memory idle.
ENV RUSTFLAGS="-C target-feature=+crt-static -C link-arg=-Wl,-z,pack-relative-relocs" \
    CARGO_TERM_COLOR=never
# What the build reads: benches/ too, because Cargo.toml names a bench target
# (tests/ and examples/ are only discovered, so they may stay out).
COPY Cargo.toml Cargo.lock build.rs ./
COPY proto ./proto
COPY src ./src
COPY benches ./benches
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    set -eux; \
    triple="$(uname -m)-unknown-linux-gnu"; \
    cargo build --profile dist --locked --target "$triple" --bin echomq-sidecar; \
    install -D -m 0755 "target/$triple/dist/echomq-sidecar" /rootfs/usr/local/bin/echomq-sidecar; \
    if readelf -l /rootfs/usr/local/bin/echomq-sidecar | grep -q INTERP; then \
      echo "echomq-sidecar is dynamically linked; it would not run FROM scratch" >&2; exit 1; \
    fi
RUN set -eux; \
    install -D -m 0644 /etc/ssl/certs/ca-certificates.crt /rootfs/etc/ssl/certs/ca-certificates.crt; \
    echo 'nonroot:x:65532:65532:nonroot:/nonexistent:/sbin/nologin' > /rootfs/etc/passwd; \
    echo 'nonroot:x:65532:' > /rootfs/etc/group; \
    chmod 0644 /rootfs/etc/passwd /rootfs/etc/group

# --- the image: nothing but the binary and those files ------------------------
FROM scratch
COPY --from=build /rootfs/ /
# Non-root; the Helm chart also sets runAsNonRoot, runAsUser 65532 and a
# read-only root filesystem, which the sidecar needs no writable path for.
USER 65532:65532
# gRPC (loopback by default: ECHOMQ_LISTEN) and the admin port (/livez, /readyz,
# /metrics: ECHOMQ_ADMIN_LISTEN).
EXPOSE 50051 9464
ENTRYPOINT ["/usr/local/bin/echomq-sidecar"]
LABEL org.opencontainers.image.title="echomq-sidecar" \
      org.opencontainers.image.description="Owns Redis Streams consumer groups and hands deliveries to services in any language over gRPC." \
      org.opencontainers.image.licenses="Apache-2.0"
