# Builds Berth the same way `make build` does, then runs it as a non-root user with the
# SQLite database in a volume.

FROM rust:1.95-bookworm AS build
RUN apt-get update -qq \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends nodejs npm \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /src
ENV CARGO_TARGET_DIR=/src/target/cargo
COPY . .
RUN make build

FROM debian:bookworm-slim
RUN apt-get update -qq \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends ca-certificates \
 && rm -rf /var/lib/apt/lists/* \
 && useradd --system --uid 10001 --home /app berth \
 && mkdir -p /data && chown berth /data
WORKDIR /app
COPY --from=build /src/target/cargo/debug/berth /usr/local/bin/berth
COPY --from=build /src/target/site /app/site
COPY config /app/config
USER berth
ENV BERTH_LISTEN=0.0.0.0:3000 \
    BERTH_DATABASE=sqlite:///data/berth.db \
    BERTH_SITE_ROOT=/app/site \
    BERTH_FLEET=/app/config/fleet.toml
VOLUME ["/data"]
EXPOSE 3000
ENTRYPOINT ["berth"]
CMD ["serve"]
