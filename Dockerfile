# The changehub binary in a small image (used by docker-compose.yml).
FROM rust:1.90-bookworm AS build
WORKDIR /src
# Dependencies first, in a layer of their own: a change to the sources does not rebuild them.
COPY Cargo.toml Cargo.lock ./
RUN mkdir -p src benches examples \
    && echo 'fn main() {}' > src/main.rs && touch src/lib.rs \
    && for b in throughput websocket_idle redis_ingest resource_index; do echo 'fn main() {}' > benches/$b.rs; done \
    && cargo build --release --locked --bin changehub \
    && rm -rf src benches
COPY . .
# Make sure the real sources are newer than the placeholder build.
RUN touch src/main.rs src/lib.rs && cargo build --release --locked --bin changehub

FROM debian:bookworm-slim
RUN apt-get update && apt-get install -y --no-install-recommends ca-certificates \
    && rm -rf /var/lib/apt/lists/*
COPY --from=build /src/target/release/changehub /usr/local/bin/changehub
RUN mkdir /data && chown nobody /data
WORKDIR /data
# The embedded store lives here; mount a volume to keep it.
VOLUME /data
USER nobody
EXPOSE 8080
# Topic URLs are built from the public URL; set it to where sources and subscribers reach the hub.
ENV CHANGEHUB_PUBLIC_URL=http://localhost:8080
HEALTHCHECK --interval=10s --timeout=5s --start-period=5s --retries=3 \
    CMD ["changehub", "healthcheck", "http://127.0.0.1:8080"]
ENTRYPOINT ["changehub"]
CMD ["serve", "--listen", "0.0.0.0:8080", "--data-dir", "/data"]
