package sqlitestore_test

import (
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"testing"
	"time"

	"github.com/retrysafe/retrysafe/idempotency"
	"github.com/retrysafe/retrysafe/idempotency/sqlitestore"
	"github.com/retrysafe/retrysafe/internal/walvfs/walvfstest"
)

// Under synchronous=FULL a claim's commit hands its WAL frames to the kernel in one
// write call; under NORMAL, whose commits end without a sync, SQLite's own VFS writes
// each frame's header and page apart.
func TestClaimCommitWritesTheWALOnce(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("counts write calls in /proc/self/io")
	}
	const claims = 20
	for _, c := range []struct {
		synchronous string
		oneWrite    bool
	}{{"FULL", true}, {"NORMAL", false}} {
		t.Run(c.synchronous, func(t *testing.T) {
			ctx := t.Context()
			path := filepath.Join(t.TempDir(), "f.db")
			s, err := sqlitestore.Open(ctx, sqlitestore.Config{Path: path, Synchronous: c.synchronous})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = s.Close() })
			wal0 := fileSize(t, path+"-wal")
			w0 := walvfstest.WriteCalls(t)
			for i := range claims {
				req := idempotency.ClaimRequest{Scope: "s", Key: "k" + strconv.Itoa(i), Fingerprint: "f", Lease: time.Minute, TTL: time.Hour}
				if res, err := s.Claim(ctx, req); err != nil || !res.Claimed {
					t.Fatalf("Claim: %+v, %v", res, err)
				}
			}
			writes := walvfstest.WriteCalls(t) - w0
			frames := (fileSize(t, path+"-wal") - wal0) / (24 + 4096)
			t.Logf("%d claims: %d WAL frames, %d write calls", claims, frames, writes)
			if frames < 2*claims {
				t.Fatalf("%d frames for %d claims: want at least two per claim for the count to tell the VFSes apart", frames, claims)
			}
			if c.oneWrite && writes > claims {
				t.Fatalf("%d write calls for %d claims, want one per commit", writes, claims)
			}
			if !c.oneWrite && writes < 2*frames {
				t.Fatalf("%d write calls for %d frames, want two per frame (SQLite's own VFS)", writes, frames)
			}
		})
	}
}

func fileSize(t *testing.T, path string) int64 {
	t.Helper()
	fi, err := os.Stat(path)
	if os.IsNotExist(err) {
		return 0
	}
	if err != nil {
		t.Fatal(err)
	}
	return fi.Size()
}
