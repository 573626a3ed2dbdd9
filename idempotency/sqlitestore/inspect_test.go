package sqlitestore_test

import (
	"bufio"
	"cmp"
	"context"
	"database/sql"
	"errors"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"github.com/retrysafe/retrysafe/idempotency"
	"github.com/retrysafe/retrysafe/idempotency/sqlitestore"
)

// mountType returns the type /proc/mounts gives the file system that holds path: the
// longest mount point that is a prefix of it.
func mountType(t *testing.T, path string) string {
	t.Helper()
	f, err := os.Open("/proc/mounts")
	if err != nil {
		t.Skipf("no /proc/mounts: %v", err)
	}
	defer f.Close()
	best, typ := "", ""
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) < 3 {
			continue
		}
		mp := fields[1]
		if (path == mp || strings.HasPrefix(path, strings.TrimSuffix(mp, "/")+"/")) && len(mp) >= len(best) {
			best, typ = mp, fields[2]
		}
	}
	return typ
}

// byCheck returns the findings by their Check, failing t on a check reported twice.
func byCheck(t *testing.T, found []idempotency.Finding) map[string]idempotency.Finding {
	t.Helper()
	m := map[string]idempotency.Finding{}
	for _, f := range found {
		if _, dup := m[f.Check]; dup {
			t.Errorf("%s reported twice", f.Check)
		}
		m[f.Check] = f
	}
	return m
}

// TestInspect: synchronous FULL keeps the promise and NORMAL loses the last commits to
// an OS crash; WAL is the journal; a file on a local disk is fine and one on tmpfs is
// lost at a reboot.
func TestInspect(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("the file systems are checked against /proc/mounts")
	}
	t.Parallel()
	// The package's directory is on the disk the module is on; /dev/shm is tmpfs.
	disk, err := os.MkdirTemp(".", "inspect-*")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(disk) })
	if disk, err = filepath.Abs(disk); err != nil {
		t.Fatal(err)
	}
	if typ := mountType(t, disk); typ == "tmpfs" || typ == "nfs" || typ == "nfs4" || typ == "9p" || strings.HasPrefix(typ, "fuse") {
		t.Skipf("the module's directory is on %s, not a local disk", typ)
	}
	if typ := mountType(t, "/dev/shm"); typ != "tmpfs" {
		t.Skipf("/dev/shm is %q, not tmpfs", typ)
	}
	shm, err := os.MkdirTemp("/dev/shm", "retrysafe-inspect-*")
	if err != nil {
		t.Skipf("/dev/shm: %v", err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(shm) })

	for _, tc := range []struct {
		dir, synchronous     string
		syncLevel, fsLevel   idempotency.FindingLevel
		syncDetail, fsDetail string
	}{
		{disk, "", idempotency.FindingOK, idempotency.FindingOK, "survives a process crash, an OS crash and a power loss", "a local file system"},
		{disk, "NORMAL", idempotency.FindingWarn, idempotency.FindingOK, "an OS crash or power loss can lose the commits since the last checkpoint", "a local file system"},
		{shm, "FULL", idempotency.FindingOK, idempotency.FindingWarn, "survives a process crash", "a reboot loses every key, and they would run again"},
		{shm, "NORMAL", idempotency.FindingWarn, idempotency.FindingWarn, "since the last checkpoint", "a reboot loses every key"},
	} {
		path := filepath.Join(tc.dir, "idem-"+tc.synchronous+".db")
		s := openConfig(t, sqlitestore.Config{Path: path, Synchronous: tc.synchronous})
		found, err := s.Inspect(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		what := path + " synchronous " + tc.synchronous
		m := byCheck(t, found)
		if f := m[sqlitestore.CheckSynchronous]; f.Level != tc.syncLevel || !strings.Contains(f.Detail, tc.syncDetail) ||
			f.Setting != "synchronous="+cmp.Or(tc.synchronous, "FULL") {
			t.Errorf("%s: %+v, want %s and %q", what, f, tc.syncLevel, tc.syncDetail)
		}
		if f := m[sqlitestore.CheckJournalMode]; f.Level != idempotency.FindingOK || f.Setting != "journal_mode=wal" {
			t.Errorf("%s: %+v, want journal_mode=wal", what, f)
		}
		if f := m[sqlitestore.CheckFilesystem]; f.Level != tc.fsLevel || !strings.Contains(f.Detail, tc.fsDetail) || !strings.HasPrefix(f.Setting, path+" on ") {
			t.Errorf("%s: %+v, want %s and %q", what, f, tc.fsLevel, tc.fsDetail)
		}
		if len(found) != 3 {
			t.Errorf("%s: %d findings, want 3: %+v", what, len(found), found)
		}
	}
}

// TestInspectOwnDatabase: a database the caller opened with another journal is judged by
// its own pragmas, read on the connection that commits; one without a journal is
// refused; a closed store is an error.
func TestInspectOwnDatabase(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "own.db")
	for _, tc := range []struct {
		pragmas string
		level   idempotency.FindingLevel
		setting string
		sync    string
	}{
		{"_pragma=journal_mode(DELETE)&_pragma=synchronous(NORMAL)", idempotency.FindingOK, "journal_mode=delete", "with a rollback journal, an OS crash or power loss at the wrong moment can corrupt the database"},
		{"_pragma=journal_mode(MEMORY)&_pragma=synchronous(OFF)", idempotency.FindingRefuse, "journal_mode=memory", "nothing is fsynced"},
	} {
		db, err := sql.Open("sqlite", "file:"+path+"?"+tc.pragmas)
		if err != nil {
			t.Fatal(err)
		}
		db.SetMaxOpenConns(1)
		s, err := sqlitestore.New(context.Background(), db, sqlitestore.Config{})
		if err != nil {
			t.Fatal(err)
		}
		found, err := s.Inspect(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		m := byCheck(t, found)
		if f := m[sqlitestore.CheckJournalMode]; f.Level != tc.level || f.Setting != tc.setting {
			t.Errorf("%s: %+v, want %s %s", tc.pragmas, f, tc.level, tc.setting)
		}
		if f := m[sqlitestore.CheckSynchronous]; f.Level != idempotency.FindingWarn || !strings.Contains(f.Detail, tc.sync) {
			t.Errorf("%s: %+v, want a warning with %q", tc.pragmas, f, tc.sync)
		}
		if err := s.Close(); err != nil {
			t.Fatal(err)
		}
		if _, err := s.Inspect(t.Context()); !errors.Is(err, idempotency.ErrClosed) {
			t.Errorf("Inspect on a closed store: %v, want ErrClosed", err)
		}
		_ = db.Close()
	}
}
