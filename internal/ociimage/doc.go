// Package ociimage builds the plugin's container images without a Docker daemon or a
// registry (`make image`, hack/image.sh): image tarballs written with
// github.com/google/go-containerregistry, loadable with `docker load`, `podman load` and
// `ctr -n k8s.io images import`.
//
// The Dockerfile stays the one description of the plugin image. ParseDockerfile reads its
// final stage: the Debian base and suite (FROM debian:<suite>[-slim]), the packages its
// `apt-get install` adds, the files its COPY lines put in the image and its ENTRYPOINT.
// hack/image.sh makes the Debian root filesystem for that suite and those packages with
// mmdebstrap (cached under ~/.cache/raid10-csi/image), and PluginImage stacks it, a layer of
// the COPY files and the ENTRYPOINT into an image; CheckPackages proves the root filesystem
// holds every package the Dockerfile installs. An instruction in the final stage that this
// package does not understand is an error, never skipped, so the two builds cannot drift
// apart silently.
//
// PauseImage wraps hack/pause (a static sandbox process) as the pod sandbox image for a
// node without registry access.
package ociimage
