# syntax=docker/dockerfile:1
# dedupd container image: build in the official Rust image, run in Debian slim as a
# non-root user with the store on a volume.
#
#   docker build -t dedupd .
#   docker run -v dedupd-data:/var/lib/dedupd -p 9464:9464 dedupd
#
# The default config is deploy/dedupd.toml (at /etc/dedupd/dedupd.toml); mount your own
# there, or override keys with DEDUPD_SECTION__KEY variables (docs/config.md).

FROM rust:1.95-bookworm AS build
# rdkafka-sys builds the bundled librdkafka with its own configure + make (no cmake), with
# OpenSSL (openssl-src: needs perl), zlib and zstd built from crates.io sources as well; it
# needs a C toolchain, make, perl and pkg-config. Listed explicitly rather than relying on
# the base image; python3 runs scripts/third-party-licenses.
RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
      build-essential perl pkg-config python3 \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /src
# Everything cargo needs to resolve the package's targets (benches are declared in
# Cargo.toml, so their files must exist even though only the binary is built).
COPY Cargo.toml Cargo.lock LICENSE ./
COPY src ./src
COPY benches ./benches
COPY scripts/third-party-licenses ./scripts/third-party-licenses
COPY scripts/licenses ./scripts/licenses
# The notices in the same step as the build: they read the package sources in the registry
# cache, which is mounted only here.
ARG VERSION=dev
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    cargo build --release --locked --bin dedupd \
 && install -m 0755 target/release/dedupd /usr/local/bin/dedupd \
 && install -d /usr/local/share/doc/dedupd \
 && install -m 0644 LICENSE /usr/local/share/doc/dedupd/LICENSE \
 && scripts/third-party-licenses "$(rustc -vV | sed -n 's/^host: //p')" "$VERSION" \
      > /usr/local/share/doc/dedupd/THIRD-PARTY-LICENSES

FROM debian:bookworm-slim AS runtime
# OCI image labels; scripts/release passes VERSION and REVISION (docker build --build-arg).
ARG VERSION=dev
ARG REVISION=unknown
LABEL org.opencontainers.image.title="dedupd" \
      org.opencontainers.image.description="Consumer-side deduplication for side-effect commands on Kafka" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${REVISION}" \
      org.opencontainers.image.documentation="README.md, docs/runbook.md" \
      org.opencontainers.image.licenses="LicenseRef-dedupd-proprietary"
# ca-certificates: HTTPS sinks, and Kafka over TLS with "ssl.ca.location" = "probe",
# verify servers against the system roots. tini: PID 1 that forwards SIGTERM to dedupd (whose
# drain needs it) and reaps the `exec` sink's children.
RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends ca-certificates tini \
 && rm -rf /var/lib/apt/lists/* \
 && groupadd --system --gid 10001 dedupd \
 && useradd --system --uid 10001 --gid dedupd --home-dir /var/lib/dedupd --shell /usr/sbin/nologin dedupd \
 && install -d -o dedupd -g dedupd -m 0750 /var/lib/dedupd \
 && install -d -m 0755 /etc/dedupd
COPY --from=build /usr/local/bin/dedupd /usr/local/bin/dedupd
COPY --from=build /usr/local/share/doc/dedupd /usr/share/doc/dedupd
COPY deploy/dedupd.toml /etc/dedupd/dedupd.toml
# In a container the listener must not be loopback-only; the store lives on the volume.
ENV DEDUPD_CONFIG=/etc/dedupd/dedupd.toml \
    DEDUPD_HTTP__LISTEN=0.0.0.0:9464 \
    DEDUPD_STORE__PATH=/var/lib/dedupd
USER 10001:10001
VOLUME ["/var/lib/dedupd"]
EXPOSE 9464
# No curl in the image: bash's /dev/tcp speaks enough HTTP for /healthz.
HEALTHCHECK --interval=15s --timeout=5s --start-period=30s --retries=3 \
  CMD ["bash", "-c", "exec 3<>/dev/tcp/127.0.0.1/9464 && printf 'GET /healthz HTTP/1.0\\r\\nHost: localhost\\r\\n\\r\\n' >&3 && head -n1 <&3 | grep -q ' 200 '"]
ENTRYPOINT ["/usr/bin/tini", "--", "dedupd"]
CMD ["run"]
