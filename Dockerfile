# syntax=docker/dockerfile:1
#
# One image, both binaries: tessera-operator and tessera-plugin share every dependency and
# always ship at the same version, so one build, one thing to mirror into a private
# registry and one tag for the chart. Each workload picks its binary with `command`.
#
#   docker build -t tessera:dev .                                    # compiles in a Rust image
#   cargo build --release --locked -p tessera-operator -p tessera-plugin --bins
#   RUSTFLAGS="-C target-feature=+crt-static" cargo build --release --locked \
#     -p tessera-cdi-hook --target x86_64-unknown-linux-gnu
#   docker build --build-arg BINARIES=prebuilt -t tessera:dev .      # takes target/release/
#   (on arm64: --target aarch64-unknown-linux-gnu and
#    --build-arg HOOK_DIR=target/aarch64-unknown-linux-gnu/release)
#
# The release workflow (.github/workflows/release.yml) builds each architecture's image
# this way on a runner of that architecture and publishes them under one multi-arch tag.
#
# `cargo xtask image [--arch arm64]` builds this file with buildah (no registry needed: it
# makes the base image locally) and runs each binary's --version inside the result.

# The Rust toolchain of rust-toolchain.toml, on the Debian release of the runtime base (the
# binaries link the glibc they are built against, so the runtime's must be as new).
ARG RUST_IMAGE=docker.io/library/rust:1.95.0-bookworm
# glibc, so the plugin can dlopen the host driver's libnvidia-ml.so.1 (a musl or static
# image cannot); no shell, no package manager. Must have the user 65532.
ARG RUNTIME_IMAGE=gcr.io/distroless/cc-debian12:nonroot
# Where the binaries come from: `source` compiles them in RUST_IMAGE; `prebuilt` copies
# target/release/tessera-{operator,plugin} from the build context (CI builds them on the
# host, where cargo's caches are warm, instead of recompiling every crate in a container).
ARG BINARIES=source

FROM ${RUST_IMAGE} AS build-source
WORKDIR /src
COPY . .
# The CDI hook runs on the host (the plugin copies it there), so it is linked statically:
# it must run whatever the host's C library.
RUN cargo build --release --locked -p tessera-operator -p tessera-plugin --bins \
 && RUSTFLAGS="-C target-feature=+crt-static" cargo build --release --locked \
      -p tessera-cdi-hook --target "$(rustc --print host-tuple)" \
 && mkdir -p /out \
 && cp target/release/tessera-operator target/release/tessera-plugin \
      target/*/release/tessera-cdi-hook /out/

FROM scratch AS build-prebuilt
# Where the binaries are in the build context: a cross build's are under
# target/<rust target>/release (`cargo xtask image --arch arm64` on an amd64 machine); the
# static CDI hook is always built for an explicit target (HOOK_DIR).
ARG PREBUILT_DIR=target/release
ARG HOOK_DIR=target/x86_64-unknown-linux-gnu/release
COPY ${PREBUILT_DIR}/tessera-operator ${PREBUILT_DIR}/tessera-plugin \
     ${HOOK_DIR}/tessera-cdi-hook /out/

# A stage of this file picked by BINARIES, not an image that could carry a tag.
# hadolint ignore=DL3006
FROM build-${BINARIES} AS binaries

FROM ${RUNTIME_IMAGE}
ARG VERSION=0.1.0
ARG REVISION=unknown
ARG CREATED=1970-01-01T00:00:00Z
LABEL org.opencontainers.image.title="tessera" \
      org.opencontainers.image.description="Tessera: on-the-fly NVIDIA GPU sharing for Kubernetes (tessera-operator and the tessera-plugin DRA kubelet plugin)" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${REVISION}" \
      org.opencontainers.image.created="${CREATED}" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.source="https://github.com/tessera-gpu/tessera" \
      org.opencontainers.image.url="https://github.com/tessera-gpu/tessera" \
      org.opencontainers.image.vendor="Tessera"
COPY --from=binaries /out/tessera-operator /out/tessera-plugin /out/tessera-cdi-hook /usr/local/bin/
# Non-root by default: the operator needs no privilege at all. The plugin's DaemonSet
# overrides this with runAsUser 0, because it opens /dev/nvidia*, creates MIG instances
# and writes into the kubelet's root-owned plugin directories (see the chart's DaemonSet).
USER 65532:65532
ENTRYPOINT ["/usr/local/bin/tessera-operator"]
