package sqlitestore

import (
	"errors"
	"strings"
	"testing"

	"github.com/retrysafe/retrysafe/idempotency"
)

// Each kind of file system is judged as its kind says: a network one is refused, FUSE
// and memory ones are warned about, and one that cannot be read is a warning too.
func TestFilesystemFinding(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name   string
		kind   fsKind
		err    error
		level  idempotency.FindingLevel
		detail string
	}{
		{"nfs", fsNetwork, nil, idempotency.FindingRefuse, "SQLite's locks are unreliable there"},
		{"9p", fsNetwork, nil, idempotency.FindingRefuse, "two writers can both claim a key"},
		{"fuse", fsFUSE, nil, idempotency.FindingWarn, "may be a network one"},
		{"tmpfs", fsMemory, nil, idempotency.FindingWarn, "a reboot loses every key"},
		{"ext2/3/4", fsLocal, nil, idempotency.FindingOK, "a local file system"},
		{"file system type 0x1234", fsUnknown, nil, idempotency.FindingOK, "not a network or memory file system this check knows"},
		{"", fsUnknown, nil, idempotency.FindingOK, "not checked on this platform"},
		{"", fsUnknown, errors.New("permission denied"), idempotency.FindingWarn, "could not read the file system"},
	} {
		f := filesystemFinding("/data/keys.db", func(string) (string, fsKind, error) { return tc.name, tc.kind, tc.err })
		if f.Check != CheckFilesystem || f.Level != tc.level || !strings.Contains(f.Detail, tc.detail) ||
			(tc.name != "" && f.Setting != "/data/keys.db on "+tc.name) {
			t.Errorf("%s: %+v, want %s with %q", tc.name, f, tc.level, tc.detail)
		}
	}
	if f := filesystemFinding("", nil); f.Level != idempotency.FindingWarn || !strings.Contains(f.Detail, "nothing survives the process") {
		t.Errorf("no file: %+v", f)
	}
	// The magic numbers of linux/magic.h that matter most.
	for magic, want := range map[uint32]fsKind{0x6969: fsNetwork, 0xFF534D42: fsNetwork, 0xFE534D42: fsNetwork,
		0x01021997: fsNetwork, 0x01021994: fsMemory, 0x858458F6: fsMemory, 0x65735546: fsFUSE, 0xEF53: fsLocal} {
		if _, got := linuxFileSystem(magic); got != want {
			t.Errorf("magic %#x: kind %d, want %d", magic, got, want)
		}
	}
}
