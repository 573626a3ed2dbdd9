package image_test

import (
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"github.com/retrysafe/retrysafe/deploy/image"
)

// TestRefused: a Dockerfile with an instruction, a flag or a command the builder does
// not interpret is refused before anything is built, with the line named, so that the
// image it builds cannot silently differ from what docker build makes of the file. The
// repository's own Dockerfile loads (the refusals are of the changes alone).
func TestRefused(t *testing.T) {
	root := repoRoot(t)
	orig, err := os.ReadFile(filepath.Join(root, "Dockerfile"))
	if err != nil {
		t.Fatal(err)
	}
	load := func(src string) error {
		file := filepath.Join(t.TempDir(), "Dockerfile")
		if err := os.WriteFile(file, []byte(src), 0o644); err != nil {
			t.Fatal(err)
		}
		_, err := image.Load(image.Options{Root: root, Dockerfile: file, GOARCH: runtime.GOARCH})
		return err
	}
	if err := load(string(orig)); err != nil {
		t.Fatalf("the repository's Dockerfile: %v", err)
	}
	replace := func(old, new string) string {
		t.Helper()
		if !strings.Contains(string(orig), old) {
			t.Fatalf("the Dockerfile has no %q", old)
		}
		return strings.Replace(string(orig), old, new, 1)
	}
	final := `ENTRYPOINT ["/retrysafe"]`
	for _, tc := range []struct {
		name, src, want string
	}{
		{"RUN in the final stage", replace(final, "RUN [\"/retrysafe\", \"version\"]\n"+final), "RUN: not interpreted in the final stage"},
		{"HEALTHCHECK", replace(final, "HEALTHCHECK CMD [\"/retrysafe\", \"version\"]\n"+final), "HEALTHCHECK: not interpreted"},
		{"ADD", replace(final, "ADD README.md /README.md\n"+final), "ADD: not interpreted"},
		{"SHELL", replace(final, "SHELL [\"/bin/sh\", \"-c\"]\n"+final), "SHELL: not interpreted"},
		{"COPY of the context in the final stage", replace(final, "COPY README.md /README.md\n"+final), "only COPY --from=STAGE"},
		{"COPY --chown in the final stage", replace("COPY --from=build /out", "COPY --from=build --chown=0:0 /out"), "only COPY --from=STAGE"},
		{"COPY of a file no stage makes", replace("/out/retrysafe /retrysafe", "/out/other /retrysafe"), "the stage makes no such file"},
		{"COPY --from an image", replace("--from=build", "--from=alpine:3"), "not an earlier stage"},
		{"a user by name", replace("USER 65532:65532", "USER nonroot"), "want numeric UID[:GID]"},
		{"CMD in shell form", replace(`CMD ["gateway"]`, "CMD gateway"), "want the JSON form"},
		{"a base image", replace("FROM scratch", "FROM alpine:3"), "must be FROM scratch"},
		{"an unknown command in a RUN", replace("chmod 1777 /rootfs/tmp", "chmod 1777 /rootfs/tmp && touch /rootfs/tmp/x"), "touch: a command the image builder does not interpret"},
		{"a semicolon in a RUN", replace("chmod 1777 /rootfs/tmp", "chmod 1777 /rootfs/tmp; true"), "shell syntax the image builder does not interpret"},
		{"a command substitution", replace("-s -w", "-s -w -X main.date=$(date)"), "shell syntax the image builder does not interpret"},
		{"an undeclared variable", replace("${VERSION}", "${REVISION}"), "$REVISION"},
		{"ENTRYPOINT not in the image", replace(final, `ENTRYPOINT ["/bin/retrysafe"]`), "not an executable file of the image"},
		{"a WORKDIR not copied in", replace("WORKDIR /data", "WORKDIR /home"), "/home is not a directory copied in"},
		{"a VOLUME not copied in", replace("VOLUME /data", "VOLUME /data /var/lib/retrysafe"), "/var/lib/retrysafe is not a directory copied in"},
		{"another escape character", "# escape=`\n" + string(orig), "only the backslash escape"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := load(tc.src)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Load: %v, want an error with %q", err, tc.want)
			}
			if !strings.Contains(err.Error(), "Dockerfile") {
				t.Errorf("the error names no file or line: %v", err)
			}
		})
	}
}
