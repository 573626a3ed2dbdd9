// Package image builds the retrysafe container image without a container engine: it
// reads the repository's Dockerfile, interprets its final stage and the stages that
// stage copies from, and assembles the same image with go-containerregistry.
//
// The Dockerfile stays the one description of the image. What the builder interprets:
//
//   - the final stage: FROM scratch; ARG; COPY --from=STAGE SRC DEST; USER (numeric
//     UID:GID); WORKDIR; ENV; LABEL; EXPOSE; VOLUME; STOPSIGNAL; ENTRYPOINT and CMD
//     (JSON form).
//   - a stage copied from: FROM (the build machine stands in for its base image); ARG;
//     ENV; WORKDIR; COPY of the build context; RUN lines of commands joined by &&:
//     mkdir [-p] [-m MODE], cp FILE DEST (the build machine's file of that path),
//     chown UID:GID, chmod OCTAL, go mod download, and go build -o FILE, which runs the
//     build machine's toolchain in the repository with the line's flags and environment
//     assignments.
//
// Anything else — another instruction, flag or command, shell syntax beyond quotes,
// $NAME and && — is refused, so that the image built here cannot differ silently from
// the one `docker build` makes of the same file.
package image
