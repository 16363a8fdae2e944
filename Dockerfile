# Builds Berth as `make release` does (an optimised binary; size-optimised WebAssembly,
# files named by their content's hash, with brotli and gzip copies), then runs it as a
# non-root user with the SQLite database in a volume.

# Tailwind 4 wants a current Node; take it from the official image.
FROM node:22-bookworm-slim AS node

FROM rust:1.95-bookworm AS build
COPY --from=node /usr/local/bin/node /usr/local/bin/node
COPY --from=node /usr/local/lib/node_modules /usr/local/lib/node_modules
RUN ln -s /usr/local/lib/node_modules/npm/bin/npm-cli.js /usr/local/bin/npm
WORKDIR /src
ENV CARGO_TARGET_DIR=/src/target/cargo
COPY . .
RUN make release

FROM debian:bookworm-slim
RUN apt-get update -qq \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends ca-certificates \
 && rm -rf /var/lib/apt/lists/* \
 && useradd --system --uid 10001 --home /app berth \
 && mkdir -p /data && chown berth /data
WORKDIR /app
COPY --from=build /src/target/cargo/release/berth /usr/local/bin/berth
COPY --from=build /src/target/release-site /app/site
COPY config /app/config
USER berth
# Reached on the published port of this machine by default (notebooks and endpoints at
# http://<id>.localhost:3000); behind a TLS proxy set BERTH_PUBLIC_URL=https://berth.example.com
# (secure __Host- cookies, HSTS) and BERTH_ENVIRONMENTS_URL=https://env.berth.example.
ENV BERTH_LISTEN=0.0.0.0:3000 \
    BERTH_PUBLIC_URL=http://127.0.0.1:3000 \
    BERTH_DATABASE=sqlite:///data/berth.db \
    BERTH_SITE_ROOT=/app/site \
    BERTH_FLEET=/app/config/fleet.toml
VOLUME ["/data"]
EXPOSE 3000
ENTRYPOINT ["berth"]
CMD ["serve"]
