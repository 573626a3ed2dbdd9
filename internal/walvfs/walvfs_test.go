package walvfs_test

import (
	"bufio"
	"context"
	"database/sql"
	"fmt"
	"math/rand/v2"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"syscall"
	"testing"

	_ "modernc.org/sqlite"

	"github.com/retrysafe/retrysafe/internal/walvfs"
	"github.com/retrysafe/retrysafe/internal/walvfs/walvfstest"
)

// open opens the database at path in WAL mode with synchronous=FULL, through the VFS
// named vfs ("" for SQLite's default), on one connection.
func open(t testing.TB, path, vfs string, extra ...string) *sql.DB {
	t.Helper()
	q := url.Values{}
	q.Add("_pragma", "busy_timeout(10000)")
	q.Add("_pragma", "journal_mode(WAL)")
	q.Add("_pragma", "synchronous(FULL)")
	for _, p := range extra {
		q.Add("_pragma", p)
	}
	q.Set("_txlock", "immediate")
	if vfs != "" {
		q.Set("vfs", vfs)
	}
	db, err := sql.Open("sqlite", "file:"+path+"?"+q.Encode())
	if err != nil {
		t.Fatal(err)
	}
	db.SetMaxOpenConns(1)
	if err := db.Ping(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = db.Close() })
	return db
}

func register(t testing.TB) string {
	t.Helper()
	name, err := walvfs.Register()
	if err != nil {
		t.Fatal(err)
	}
	return name
}

// TestCommitIsOneWrite commits a transaction of about 24 pages through SQLite's default
// VFS and through this one, and counts the write calls each commit makes: two per WAL
// frame on the default, one for the whole transaction here.
func TestCommitIsOneWrite(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("counts write calls in /proc/self/io")
	}
	name := register(t)
	for _, c := range []struct {
		vfs       string
		maxWrites func(frames int64) int64
	}{
		{"", nil},
		{name, func(frames int64) int64 { return (frames*(24+4096))/(1<<17-1) + 1 }},
	} {
		t.Run("vfs="+c.vfs, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "db")
			db := open(t, path, c.vfs)
			if _, err := db.Exec(`CREATE TABLE t (b BLOB)`); err != nil {
				t.Fatal(err)
			}
			tx, err := db.Begin()
			if err != nil {
				t.Fatal(err)
			}
			for i := range 24 {
				if _, err := tx.Exec(`INSERT INTO t VALUES (?)`, randomBytes(i, 3000)); err != nil {
					t.Fatal(err)
				}
			}
			before := walSize(t, path)
			w0 := walvfstest.WriteCalls(t)
			if err := tx.Commit(); err != nil {
				t.Fatal(err)
			}
			writes := walvfstest.WriteCalls(t) - w0
			frames := (walSize(t, path) - before) / (24 + 4096)
			t.Logf("commit of %d WAL frames: %d write calls", frames, writes)
			if frames < 20 {
				t.Fatalf("the commit wrote %d frames, want 20 or more for the test to mean something", frames)
			}
			if c.maxWrites == nil {
				// SQLite's own VFS: the header and the page of every frame apart. This is
				// what the other case must beat, and shows that the count sees it.
				if writes < 2*frames {
					t.Fatalf("default VFS: %d write calls for %d frames, want at least %d", writes, frames, 2*frames)
				}
				return
			}
			if max := c.maxWrites(frames); writes > max {
				t.Fatalf("%d write calls for %d frames, want at most %d", writes, frames, max)
			}
		})
	}
}

func walSize(t *testing.T, path string) int64 {
	t.Helper()
	fi, err := os.Stat(path + "-wal")
	if os.IsNotExist(err) {
		return 0
	}
	if err != nil {
		t.Fatal(err)
	}
	return fi.Size()
}

// randomBytes returns n bytes that depend on seed only.
func randomBytes(seed, n int) []byte {
	r := rand.New(rand.NewPCG(uint64(seed), 7))
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(r.Uint32())
	}
	return b
}

// TestReadersSeeEveryCommit writes through this VFS, in transactions from one row to
// more pages than its buffer holds, with a page cache so small that SQLite spills pages
// to the WAL before the commit and writes some of them again, some transactions rolled
// back, and checkpoints that restart the WAL. After every commit a connection of
// SQLite's default VFS, reading the WAL through a file handle of its own, must see
// exactly what was committed; at the end the file must pass SQLite's integrity check.
func TestReadersSeeEveryCommit(t *testing.T) {
	name := register(t)
	path := filepath.Join(t.TempDir(), "db")
	w := open(t, path, name, "cache_size(8)")
	r := open(t, path, "")
	if _, err := w.Exec(`CREATE TABLE t (id INTEGER PRIMARY KEY, b BLOB)`); err != nil {
		t.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(1, 2))
	rows, bytes := 0, 0
	for i := range 120 {
		n := 1 + rng.IntN(80)
		tx, err := w.Begin()
		if err != nil {
			t.Fatal(err)
		}
		added := 0
		for j := range n {
			size := 1 + rng.IntN(3000)
			if _, err := tx.Exec(`INSERT INTO t (b) VALUES (?)`, randomBytes(i*1000+j, size)); err != nil {
				t.Fatal(err)
			}
			added += size
		}
		// Rewrite earlier rows too, so that pages already in the WAL change again.
		if _, err := tx.Exec(`UPDATE t SET b = b WHERE id % 7 = ?`, i%7); err != nil {
			t.Fatal(err)
		}
		if rng.IntN(5) == 0 {
			if err := tx.Rollback(); err != nil {
				t.Fatal(err)
			}
		} else {
			if err := tx.Commit(); err != nil {
				t.Fatalf("transaction %d: commit: %v", i, err)
			}
			rows, bytes = rows+n, bytes+added
		}
		var gotRows, gotBytes int
		if err := r.QueryRow(`SELECT count(*), coalesce(sum(length(b)), 0) FROM t`).Scan(&gotRows, &gotBytes); err != nil {
			t.Fatal(err)
		}
		if gotRows != rows || gotBytes != bytes {
			t.Fatalf("after transaction %d a reader sees %d rows of %d bytes, want %d of %d", i, gotRows, gotBytes, rows, bytes)
		}
		if i%40 == 39 {
			if _, err := w.Exec(`PRAGMA wal_checkpoint(TRUNCATE)`); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	if err := r.Close(); err != nil {
		t.Fatal(err)
	}
	checkFile(t, path, rows, bytes)
}

// sound opens path with SQLite's default VFS and fails t unless the file passes
// SQLite's integrity check.
func sound(t *testing.T, path string) *sql.DB {
	t.Helper()
	db := open(t, path, "")
	var ok string
	if err := db.QueryRow(`PRAGMA integrity_check`).Scan(&ok); err != nil {
		t.Fatal(err)
	}
	if ok != "ok" {
		t.Fatalf("integrity_check: %s", ok)
	}
	return db
}

// checkFile checks that the file at path is sound and that its t holds rows rows of
// bytes bytes.
func checkFile(t *testing.T, path string, rows, bytes int) {
	t.Helper()
	db := sound(t, path)
	var gotRows, gotBytes int
	if err := db.QueryRow(`SELECT count(*), coalesce(sum(length(b)), 0) FROM t`).Scan(&gotRows, &gotBytes); err != nil {
		t.Fatal(err)
	}
	if gotRows != rows || gotBytes != bytes {
		t.Fatalf("the file holds %d rows of %d bytes, want %d of %d", gotRows, gotBytes, rows, bytes)
	}
}

// childEnv names the database a re-run of this test binary writes to until it is
// killed (TestKilledWriterLosesNoCommit).
const childEnv = "WALVFS_TEST_WRITER"

func TestMain(m *testing.M) {
	if path := os.Getenv(childEnv); path != "" {
		os.Exit(writeUntilKilled(path))
	}
	os.Exit(m.Run())
}

// writeUntilKilled commits transactions of one to forty rows through this VFS, for
// ever, and prints each one's number once its commit has returned.
func writeUntilKilled(path string) int {
	name, err := walvfs.Register()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	db, err := sql.Open("sqlite", "file:"+path+"?_pragma=journal_mode(WAL)&_pragma=synchronous(FULL)&_txlock=immediate&vfs="+name)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	db.SetMaxOpenConns(1)
	ctx := context.Background()
	if _, err := db.ExecContext(ctx, `CREATE TABLE t (id INTEGER PRIMARY KEY, tx INTEGER, b BLOB)`); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	out := bufio.NewWriter(os.Stdout)
	for i := 0; ; i++ {
		tx, err := db.BeginTx(ctx, nil)
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		for j := range 1 + i%40 {
			if _, err := tx.ExecContext(ctx, `INSERT INTO t (tx, b) VALUES (?, ?)`, i, randomBytes(i*100+j, 2000)); err != nil {
				fmt.Fprintln(os.Stderr, err)
				return 1
			}
		}
		if err := tx.Commit(); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		fmt.Fprintln(out, i)
		if err := out.Flush(); err != nil {
			return 1
		}
	}
}

// TestKilledWriterLosesNoCommit kills a process that writes through this VFS in the
// middle of its work, with SIGKILL, and checks that every transaction whose commit had
// returned in it is in the file, whole, and that the file is sound.
func TestKilledWriterLosesNoCommit(t *testing.T) {
	path := filepath.Join(t.TempDir(), "db")
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), childEnv+"="+path)
	cmd.Stderr = os.Stderr
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	lines := bufio.NewScanner(stdout)
	last := -1
	for last < 300 && lines.Scan() {
		if last, err = strconv.Atoi(lines.Text()); err != nil {
			t.Fatal(err)
		}
	}
	if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = cmd.Wait()
	if last < 300 {
		t.Fatalf("the writer stopped after transaction %d", last)
	}
	db := sound(t, path)
	rs, err := db.Query(`SELECT tx, count(*) FROM t GROUP BY tx ORDER BY tx`)
	if err != nil {
		t.Fatal(err)
	}
	defer rs.Close()
	want := 0
	for rs.Next() {
		var tx, n int
		if err := rs.Scan(&tx, &n); err != nil {
			t.Fatal(err)
		}
		if tx != want || n != 1+tx%40 {
			t.Fatalf("transaction %d holds %d rows in the file, want transaction %d with %d", tx, n, want, 1+want%40)
		}
		want++
	}
	if err := rs.Err(); err != nil {
		t.Fatal(err)
	}
	if want <= last {
		t.Fatalf("the file holds transactions 0 to %d; the writer had committed up to %d", want-1, last)
	}
	t.Logf("writer killed after its commit %d; the file holds transactions 0 to %d", last, want-1)
}
