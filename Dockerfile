# The changehub binary in a small image (used by docker-compose.yml).
FROM rust:1.90-bookworm AS build
WORKDIR /src
COPY . .
RUN cargo build --release --locked --bin changehub

FROM debian:bookworm-slim
RUN apt-get update && apt-get install -y --no-install-recommends ca-certificates \
    && rm -rf /var/lib/apt/lists/*
COPY --from=build /src/target/release/changehub /usr/local/bin/changehub
RUN mkdir /data && chown nobody /data
WORKDIR /data
USER nobody
EXPOSE 8080
# Topic URLs are built from the public URL; set it to where sources and subscribers reach the hub.
ENV CHANGEHUB_PUBLIC_URL=http://localhost:8080
ENTRYPOINT ["changehub"]
CMD ["serve", "--listen", "0.0.0.0:8080"]
