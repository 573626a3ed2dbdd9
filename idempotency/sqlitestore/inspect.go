package sqlitestore

import (
	"context"
	"fmt"
	"strings"

	"github.com/retrysafe/retrysafe/idempotency"
)

// Checks of Inspect: the Check of each Finding it reports.
const (
	// CheckSynchronous is PRAGMA synchronous of the connection that commits.
	CheckSynchronous = "sqlite.synchronous"
	// CheckJournalMode is PRAGMA journal_mode. OFF and MEMORY are refused.
	CheckJournalMode = "sqlite.journal_mode"
	// CheckFilesystem is the file system of the database file: a network one (NFS,
	// SMB/CIFS, 9p, Ceph, AFS…) is refused, FUSE and memory (tmpfs, ramfs) are warned
	// about. Linux and macOS only.
	CheckFilesystem = "sqlite.filesystem"
)

var _ idempotency.Inspector = (*Store)(nil)

// Inspect implements idempotency.Inspector: it reads, on the connection that commits,
// PRAGMA synchronous, journal_mode and database_list, and the file system of the
// database file, and says what each means for the promise that a keyed request runs
// once. It writes nothing.
func (s *Store) Inspect(ctx context.Context) ([]idempotency.Finding, error) {
	if err := s.check(ctx); err != nil {
		return nil, err
	}
	// The pragmas are per connection: read them where the store's writes commit.
	conn, err := s.write.Conn(ctx)
	if err != nil {
		return nil, fmt.Errorf("sqlitestore: inspect: %w", err)
	}
	defer conn.Close()
	var (
		synchronous int
		journal     string
		file        string
	)
	if err := conn.QueryRowContext(ctx, `PRAGMA synchronous`).Scan(&synchronous); err != nil {
		return nil, fmt.Errorf("sqlitestore: inspect: synchronous: %w", err)
	}
	if err := conn.QueryRowContext(ctx, `PRAGMA journal_mode`).Scan(&journal); err != nil {
		return nil, fmt.Errorf("sqlitestore: inspect: journal_mode: %w", err)
	}
	if err := conn.QueryRowContext(ctx, `SELECT file FROM pragma_database_list WHERE name = 'main'`).Scan(&file); err != nil {
		return nil, fmt.Errorf("sqlitestore: inspect: database_list: %w", err)
	}
	journal = strings.ToLower(journal)
	wal := journal == "wal"
	return []idempotency.Finding{
		synchronousFinding(synchronous, wal),
		journalFinding(journal),
		filesystemFinding(file, fileSystem),
	}, nil
}

// synchronousFinding says what PRAGMA synchronous (0 OFF, 1 NORMAL, 2 FULL, 3 EXTRA)
// means, in WAL mode or with a rollback journal.
func synchronousFinding(level int, wal bool) idempotency.Finding {
	f := idempotency.Finding{Check: CheckSynchronous}
	switch level {
	case 2, 3:
		f.Level = idempotency.FindingOK
		f.Setting = map[int]string{2: "synchronous=FULL", 3: "synchronous=EXTRA"}[level]
		f.Detail = "every commit is on disk before it is acknowledged: a claim or a completion survives a process crash, an OS crash and a power loss"
	case 1:
		f.Level = idempotency.FindingWarn
		f.Setting = "synchronous=NORMAL"
		if wal {
			f.Detail = "an OS crash or power loss can lose the commits since the last checkpoint (a process crash loses none): completed keys would run again"
		} else {
			f.Detail = "with a rollback journal, an OS crash or power loss at the wrong moment can corrupt the database: its keys would run again"
		}
	default:
		f.Level = idempotency.FindingWarn
		f.Setting = fmt.Sprintf("synchronous=OFF (%d)", level)
		f.Detail = "nothing is fsynced: an OS crash or power loss can lose recent commits and corrupt the database: keys would run again"
	}
	return f
}

// journalFinding says what PRAGMA journal_mode means.
func journalFinding(mode string) idempotency.Finding {
	f := idempotency.Finding{Check: CheckJournalMode, Setting: "journal_mode=" + mode}
	switch mode {
	case "wal":
		f.Level = idempotency.FindingOK
		f.Detail = "write-ahead log: a commit survives a crash of the process; readers never wait for the writer"
	case "delete", "truncate", "persist":
		f.Level = idempotency.FindingOK
		f.Detail = "rollback journal: commits are as durable as synchronous says; readers wait while a write commits"
	default: // off, memory
		f.Level = idempotency.FindingRefuse
		f.Detail = "no journal on disk: a crash during a commit can corrupt the database, and every key in it would run again"
	}
	return f
}

// fsKind is what a file system means for SQLite.
type fsKind int

const (
	fsUnknown fsKind = iota // not checked, or a type not listed
	fsLocal                 // a local disk file system
	fsMemory                // tmpfs, ramfs: gone at a reboot
	fsFUSE                  // FUSE: local or network, cannot tell
	fsNetwork               // NFS, SMB, 9p…: locks and shared memory unreliable
)

// filesystemFinding says what the file system of the database file at path, as
// fileSystem names it, means.
func filesystemFinding(path string, fileSystem func(string) (string, fsKind, error)) idempotency.Finding {
	f := idempotency.Finding{Check: CheckFilesystem}
	if path == "" {
		f.Level, f.Setting = idempotency.FindingWarn, "no file (in-memory or temporary database)"
		f.Detail = "nothing survives the process: after a restart every key would run again"
		return f
	}
	name, kind, err := fileSystem(path)
	switch {
	case err != nil:
		f.Level, f.Setting = idempotency.FindingWarn, path
		f.Detail = "could not read the file system of the database file (" + err.Error() + "): keep it on a local disk, not a network or memory file system"
		return f
	case name == "":
		f.Level, f.Setting = idempotency.FindingOK, path
		f.Detail = "the file system is not checked on this platform: keep the file on a local disk, not a network file system"
		return f
	}
	f.Setting = path + " on " + name
	switch kind {
	case fsNetwork:
		f.Level = idempotency.FindingRefuse
		f.Detail = "a network file system: SQLite's locks are unreliable there and WAL needs shared memory it does not give, so two writers can both claim a key and the database can be corrupted"
	case fsFUSE:
		f.Level = idempotency.FindingWarn
		f.Detail = "a FUSE file system, which may be a network one (sshfs, s3fs…): there SQLite's locks are unreliable and two writers could both claim a key; keep the file on a local disk"
	case fsMemory:
		f.Level = idempotency.FindingWarn
		f.Detail = "a file system in memory: a reboot loses every key, and they would run again"
	case fsLocal:
		f.Level = idempotency.FindingOK
		f.Detail = "a local file system"
	default:
		f.Level = idempotency.FindingOK
		f.Detail = "not a network or memory file system this check knows"
	}
	return f
}

// linuxFileSystem names the file system whose statfs f_type (its magic number,
// linux/magic.h) is magic, and says what it means for SQLite.
func linuxFileSystem(magic uint32) (string, fsKind) {
	switch magic {
	case 0xEF53:
		return "ext2/3/4", fsLocal
	case 0x58465342:
		return "xfs", fsLocal
	case 0x9123683E:
		return "btrfs", fsLocal
	case 0x2FC12FC1:
		return "zfs", fsLocal
	case 0xF2F52010:
		return "f2fs", fsLocal
	case 0x794C7630:
		return "overlayfs", fsLocal
	case 0x4D44:
		return "vfat", fsLocal
	case 0x01021994:
		return "tmpfs", fsMemory
	case 0x858458F6:
		return "ramfs", fsMemory
	case 0x65735546:
		return "fuse", fsFUSE
	case 0x6969:
		return "nfs", fsNetwork
	case 0x517B:
		return "smb", fsNetwork
	case 0xFF534D42:
		return "cifs", fsNetwork
	case 0xFE534D42:
		return "smb2", fsNetwork
	case 0x01021997:
		return "9p", fsNetwork
	case 0x00C36400:
		return "ceph", fsNetwork
	case 0x5346414F, 0x6B414653:
		return "afs", fsNetwork
	case 0x73757245:
		return "coda", fsNetwork
	case 0x564C:
		return "ncp", fsNetwork
	case 0x0BD00BD0:
		return "lustre", fsNetwork
	case 0x47504653:
		return "gpfs", fsNetwork
	}
	return fmt.Sprintf("file system type %#x", magic), fsUnknown
}
