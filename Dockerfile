# Multi-stage build: a static binary on a small runtime with the filesystem tools the node
# plugin runs (mkfs.ext4, mkfs.xfs, blkid, resize2fs, xfs_growfs, cryptsetup).
FROM golang:1.26 AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
RUN CGO_ENABLED=0 go build -trimpath -ldflags="-s -w" -o /out/raid10-csi ./cmd/raid10-csi \
 && CGO_ENABLED=0 go build -trimpath -ldflags="-s -w" -o /out/kubectl-raid10 ./cmd/kubectl-raid10

FROM debian:bookworm-slim
RUN apt-get update \
 && apt-get install -y --no-install-recommends e2fsprogs xfsprogs util-linux kmod cryptsetup-bin \
 && rm -rf /var/lib/apt/lists/*
COPY --from=build /out/raid10-csi /out/kubectl-raid10 /usr/local/bin/
ENTRYPOINT ["/usr/local/bin/raid10-csi"]
