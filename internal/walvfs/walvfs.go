// Package walvfs is a SQLite VFS (for modernc.org/sqlite) that hands a transaction's
// write-ahead log to the operating system in one write instead of two per page.
//
// SQLite appends a committed page to the WAL as two writes: a 24-byte frame header, then
// the page. A transaction of 20 pages is 40 pwrite calls, and on a virtual machine each
// system call costs microseconds of CPU, more than the copy it performs. This VFS wraps
// the default one; for the WAL file only, it gathers writes that continue one another
// into one buffer and writes the buffer out, in one call, before anything that depends
// on the bytes being in the file: a sync, a read, a size query, a truncation, a file
// control, a write elsewhere in the file, and closing. Every other file (the database,
// its shared-memory index) is the wrapped VFS's own, untouched.
//
// The rule it relies on: under synchronous=FULL or EXTRA, SQLite syncs the WAL at the end
// of every commit, before it publishes the new frames to other connections in the
// wal-index and before the commit returns. So a frame is in the file before any reader
// can look for it, and on disk before a commit is acknowledged, exactly as without the
// buffer. What the buffer may still hold when the process dies is only a transaction
// that had not committed, which SQLite discards on recovery anyway. Under
// synchronous=NORMAL a commit ends without a sync and its frames would stay in the
// buffer after the wal-index names them: a connection opened with this VFS must use FULL
// or EXTRA, and Register's callers check that.
package walvfs

import (
	"fmt"
	"sync"
	"unsafe"

	"modernc.org/libc"
	"modernc.org/libc/sys/types"
	sqlite3 "modernc.org/sqlite/lib"
)

// Name is the name the VFS is registered under: the vfs parameter of a modernc.org/sqlite
// DSN selects it.
const Name = "retrysafe-walbuf"

// bufSize is how many bytes of consecutive WAL writes are held before they are written
// out: the most the unix VFS hands to one pwrite (it masks a write's length to 17 bits,
// as SQLite itself never writes more at once), 31 frames of a 4 KiB page. A larger
// transaction is written in several calls.
const bufSize = 1<<17 - 1

// register makes the VFS once per process: SQLite's list of VFSes is process-wide, and
// the VFS holds no state of its own beyond the wrapped VFS and its method table, both
// fixed once made.
var register = sync.OnceValue(func() error {
	tls := libc.NewTLS()
	defer tls.Close()
	if rc := sqlite3.Xsqlite3_initialize(tls); rc != sqlite3.SQLITE_OK {
		return fmt.Errorf("walvfs: sqlite3_initialize: code %d", rc)
	}
	real := sqlite3.Xsqlite3_vfs_find(tls, 0)
	if real == 0 {
		return fmt.Errorf("walvfs: SQLite has no default VFS")
	}
	name, err := libc.CString(Name)
	if err != nil {
		return fmt.Errorf("walvfs: %w", err)
	}
	// The VFS, followed by the WAL files' method table, lives in C memory for the life
	// of the process: SQLite keeps pointers to both.
	vfs := libc.Xcalloc(tls, 1, types.Size_t(vfsSize+unsafe.Sizeof(sqlite3.Tsqlite3_io_methods{})))
	if vfs == 0 {
		return fmt.Errorf("walvfs: out of memory")
	}
	methods := vfs + vfsSize
	v := (*sqlite3.Tsqlite3_vfs)(cptr(vfs))
	*v = *(*sqlite3.Tsqlite3_vfs)(cptr(real))
	v.FpNext = 0
	v.FzName = name
	// A WAL file is this package's header followed by the wrapped VFS's file.
	v.FszOsFile = int32(headerSize) + v.FszOsFile
	// xOpen finds the wrapped VFS here. The wrapped VFS's other methods, copied above,
	// never read pAppData (unix's xOpen is the one that does, and it is called with the
	// wrapped VFS itself).
	v.FpAppData = real
	*(*func(*libc.TLS, uintptr, uintptr, uintptr, int32, uintptr) int32)(unsafe.Pointer(&v.FxOpen)) = xOpen

	m := (*sqlite3.Tsqlite3_io_methods)(cptr(methods))
	m.FiVersion = 3
	*(*func(*libc.TLS, uintptr) int32)(unsafe.Pointer(&m.FxClose)) = xClose
	*(*func(*libc.TLS, uintptr, uintptr, int32, int64) int32)(unsafe.Pointer(&m.FxRead)) = xRead
	*(*func(*libc.TLS, uintptr, uintptr, int32, int64) int32)(unsafe.Pointer(&m.FxWrite)) = xWrite
	*(*func(*libc.TLS, uintptr, int64) int32)(unsafe.Pointer(&m.FxTruncate)) = xTruncate
	*(*func(*libc.TLS, uintptr, int32) int32)(unsafe.Pointer(&m.FxSync)) = xSync
	*(*func(*libc.TLS, uintptr, uintptr) int32)(unsafe.Pointer(&m.FxFileSize)) = xFileSize
	*(*func(*libc.TLS, uintptr, int32) int32)(unsafe.Pointer(&m.FxLock)) = xLock
	*(*func(*libc.TLS, uintptr, int32) int32)(unsafe.Pointer(&m.FxUnlock)) = xUnlock
	*(*func(*libc.TLS, uintptr, uintptr) int32)(unsafe.Pointer(&m.FxCheckReservedLock)) = xCheckReservedLock
	*(*func(*libc.TLS, uintptr, int32, uintptr) int32)(unsafe.Pointer(&m.FxFileControl)) = xFileControl
	*(*func(*libc.TLS, uintptr) int32)(unsafe.Pointer(&m.FxSectorSize)) = xSectorSize
	*(*func(*libc.TLS, uintptr) int32)(unsafe.Pointer(&m.FxDeviceCharacteristics)) = xDeviceCharacteristics
	*(*func(*libc.TLS, uintptr, int32, int32, int32, uintptr) int32)(unsafe.Pointer(&m.FxShmMap)) = xShmMap
	*(*func(*libc.TLS, uintptr, int32, int32, int32) int32)(unsafe.Pointer(&m.FxShmLock)) = xShmLock
	*(*func(*libc.TLS, uintptr))(unsafe.Pointer(&m.FxShmBarrier)) = xShmBarrier
	*(*func(*libc.TLS, uintptr, int32) int32)(unsafe.Pointer(&m.FxShmUnmap)) = xShmUnmap
	*(*func(*libc.TLS, uintptr, int64, int32, uintptr) int32)(unsafe.Pointer(&m.FxFetch)) = xFetch
	*(*func(*libc.TLS, uintptr, int64, uintptr) int32)(unsafe.Pointer(&m.FxUnfetch)) = xUnfetch

	if rc := sqlite3.Xsqlite3_vfs_register(tls, vfs, 0); rc != sqlite3.SQLITE_OK {
		return fmt.Errorf("walvfs: sqlite3_vfs_register: code %d", rc)
	}
	return nil
})

// vfsSize is the VFS structure's size rounded up to 16 bytes: the WAL files' method
// table follows it.
const vfsSize = (unsafe.Sizeof(sqlite3.Tsqlite3_vfs{}) + 15) &^ 15

// Register registers the VFS with SQLite, once per process, and returns its name. A
// database opened with it must run with synchronous=FULL or EXTRA (see the package doc).
func Register() (string, error) {
	if err := register(); err != nil {
		return "", err
	}
	return Name, nil
}

// walFile is the start of a WAL file opened through the VFS, in the memory SQLite
// allocates for it (szOsFile bytes); the wrapped VFS's file follows it.
type walFile struct {
	methods uintptr // sqlite3_file.pMethods: the table after the VFS
	real    uintptr // the wrapped file, headerSize bytes after this header
	buf     uintptr // bufSize bytes of C memory, made at the first write
	n       int64   // bytes held in buf
	off     int64   // the file offset of buf's first byte
}

// headerSize is walFile's size rounded up to 16 bytes, the wrapped file's alignment.
const headerSize = (unsafe.Sizeof(walFile{}) + 15) &^ 15

// cptr is the C address p as a pointer. Every address this package converts is of C
// memory (SQLite's, or libc's allocator), which Go's garbage collector neither moves nor
// frees: the case vet's unsafeptr check cannot tell from a Go pointer hidden in a uintptr.
func cptr(p uintptr) unsafe.Pointer { return *(*unsafe.Pointer)(unsafe.Pointer(&p)) }

func fileOf(p uintptr) *walFile { return (*walFile)(cptr(p)) }

// realMethods is the method table of the wrapped file f.
func realMethods(f *walFile) *sqlite3.Tsqlite3_io_methods {
	return (*sqlite3.Tsqlite3_io_methods)(cptr((*sqlite3.Tsqlite3_file)(cptr(f.real)).FpMethods))
}

// fn turns the C function pointer p into a Go function of type F (a transpiled C
// function pointer is the code word of a Go func value).
func fn[F any](p uintptr) F { return *(*F)(unsafe.Pointer(&struct{ uintptr }{p})) }

func xOpen(tls *libc.TLS, pVfs, zName, pFile uintptr, flags int32, pOutFlags uintptr) int32 {
	real := (*sqlite3.Tsqlite3_vfs)(cptr(pVfs)).FpAppData
	open := fn[func(*libc.TLS, uintptr, uintptr, uintptr, int32, uintptr) int32]((*sqlite3.Tsqlite3_vfs)(cptr(real)).FxOpen)
	if flags&sqlite3.SQLITE_OPEN_WAL == 0 {
		// Any other file is the wrapped VFS's, at the start of the memory given.
		return open(tls, real, zName, pFile, flags, pOutFlags)
	}
	f := fileOf(pFile)
	*f = walFile{real: pFile + headerSize}
	if rc := open(tls, real, zName, f.real, flags, pOutFlags); rc != sqlite3.SQLITE_OK {
		// pMethods stays 0: SQLite does not close a file whose open failed.
		return rc
	}
	f.methods = pVfs + vfsSize
	return sqlite3.SQLITE_OK
}

// flush writes out what f's buffer holds.
func flush(tls *libc.TLS, f *walFile) int32 {
	if f.n == 0 {
		return sqlite3.SQLITE_OK
	}
	n := f.n
	f.n = 0
	return fn[func(*libc.TLS, uintptr, uintptr, int32, int64) int32](realMethods(f).FxWrite)(tls, f.real, f.buf, int32(n), f.off)
}

func xWrite(tls *libc.TLS, pFile, zBuf uintptr, iAmt int32, iOfst int64) int32 {
	f := fileOf(pFile)
	amt := int64(iAmt)
	if f.n > 0 && iOfst == f.off+f.n && f.n+amt <= bufSize {
		libc.Xmemcpy(tls, f.buf+uintptr(f.n), zBuf, types.Size_t(amt))
		f.n += amt
		return sqlite3.SQLITE_OK
	}
	// Not a continuation: what is held goes first, so that the file sees the writes in
	// the order they were made.
	if rc := flush(tls, f); rc != sqlite3.SQLITE_OK {
		return rc
	}
	if f.buf == 0 && amt <= bufSize {
		f.buf = libc.Xmalloc(tls, bufSize)
	}
	if f.buf == 0 || amt > bufSize {
		return fn[func(*libc.TLS, uintptr, uintptr, int32, int64) int32](realMethods(f).FxWrite)(tls, f.real, zBuf, iAmt, iOfst)
	}
	libc.Xmemcpy(tls, f.buf, zBuf, types.Size_t(amt))
	f.off, f.n = iOfst, amt
	return sqlite3.SQLITE_OK
}

func xClose(tls *libc.TLS, pFile uintptr) int32 {
	f := fileOf(pFile)
	rc := flush(tls, f)
	if rc2 := fn[func(*libc.TLS, uintptr) int32](realMethods(f).FxClose)(tls, f.real); rc == sqlite3.SQLITE_OK {
		rc = rc2
	}
	if f.buf != 0 {
		libc.Xfree(tls, f.buf)
		f.buf = 0
	}
	return rc
}

func xRead(tls *libc.TLS, pFile, zBuf uintptr, iAmt int32, iOfst int64) int32 {
	f := fileOf(pFile)
	if rc := flush(tls, f); rc != sqlite3.SQLITE_OK {
		return rc
	}
	return fn[func(*libc.TLS, uintptr, uintptr, int32, int64) int32](realMethods(f).FxRead)(tls, f.real, zBuf, iAmt, iOfst)
}

func xTruncate(tls *libc.TLS, pFile uintptr, size int64) int32 {
	f := fileOf(pFile)
	if rc := flush(tls, f); rc != sqlite3.SQLITE_OK {
		return rc
	}
	return fn[func(*libc.TLS, uintptr, int64) int32](realMethods(f).FxTruncate)(tls, f.real, size)
}

func xSync(tls *libc.TLS, pFile uintptr, flags int32) int32 {
	f := fileOf(pFile)
	if rc := flush(tls, f); rc != sqlite3.SQLITE_OK {
		return rc
	}
	return fn[func(*libc.TLS, uintptr, int32) int32](realMethods(f).FxSync)(tls, f.real, flags)
}

func xFileSize(tls *libc.TLS, pFile, pSize uintptr) int32 {
	f := fileOf(pFile)
	if rc := flush(tls, f); rc != sqlite3.SQLITE_OK {
		return rc
	}
	return fn[func(*libc.TLS, uintptr, uintptr) int32](realMethods(f).FxFileSize)(tls, f.real, pSize)
}

func xFileControl(tls *libc.TLS, pFile uintptr, op int32, pArg uintptr) int32 {
	f := fileOf(pFile)
	// A file control may look at the file (its size, its handle): it sees every write.
	if rc := flush(tls, f); rc != sqlite3.SQLITE_OK {
		return rc
	}
	return fn[func(*libc.TLS, uintptr, int32, uintptr) int32](realMethods(f).FxFileControl)(tls, f.real, op, pArg)
}

func xFetch(tls *libc.TLS, pFile uintptr, iOfst int64, iAmt int32, pp uintptr) int32 {
	f := fileOf(pFile)
	if rc := flush(tls, f); rc != sqlite3.SQLITE_OK {
		return rc
	}
	m := realMethods(f)
	if m.FiVersion < 3 || m.FxFetch == 0 {
		*(*uintptr)(cptr(pp)) = 0 // no mapping: SQLite reads instead
		return sqlite3.SQLITE_OK
	}
	return fn[func(*libc.TLS, uintptr, int64, int32, uintptr) int32](m.FxFetch)(tls, f.real, iOfst, iAmt, pp)
}

// The methods below do not touch the file's bytes: they go to the wrapped file as they
// are.

func xLock(tls *libc.TLS, pFile uintptr, lock int32) int32 {
	f := fileOf(pFile)
	return fn[func(*libc.TLS, uintptr, int32) int32](realMethods(f).FxLock)(tls, f.real, lock)
}

func xUnlock(tls *libc.TLS, pFile uintptr, lock int32) int32 {
	f := fileOf(pFile)
	return fn[func(*libc.TLS, uintptr, int32) int32](realMethods(f).FxUnlock)(tls, f.real, lock)
}

func xCheckReservedLock(tls *libc.TLS, pFile, pResOut uintptr) int32 {
	f := fileOf(pFile)
	return fn[func(*libc.TLS, uintptr, uintptr) int32](realMethods(f).FxCheckReservedLock)(tls, f.real, pResOut)
}

func xSectorSize(tls *libc.TLS, pFile uintptr) int32 {
	f := fileOf(pFile)
	return fn[func(*libc.TLS, uintptr) int32](realMethods(f).FxSectorSize)(tls, f.real)
}

func xDeviceCharacteristics(tls *libc.TLS, pFile uintptr) int32 {
	f := fileOf(pFile)
	return fn[func(*libc.TLS, uintptr) int32](realMethods(f).FxDeviceCharacteristics)(tls, f.real)
}

func xShmMap(tls *libc.TLS, pFile uintptr, iPg, pgsz, bExtend int32, pp uintptr) int32 {
	f := fileOf(pFile)
	m := realMethods(f)
	if m.FiVersion < 2 || m.FxShmMap == 0 {
		return sqlite3.SQLITE_IOERR
	}
	return fn[func(*libc.TLS, uintptr, int32, int32, int32, uintptr) int32](m.FxShmMap)(tls, f.real, iPg, pgsz, bExtend, pp)
}

func xShmLock(tls *libc.TLS, pFile uintptr, offset, n, flags int32) int32 {
	f := fileOf(pFile)
	m := realMethods(f)
	if m.FiVersion < 2 || m.FxShmLock == 0 {
		return sqlite3.SQLITE_IOERR
	}
	return fn[func(*libc.TLS, uintptr, int32, int32, int32) int32](m.FxShmLock)(tls, f.real, offset, n, flags)
}

func xShmBarrier(tls *libc.TLS, pFile uintptr) {
	f := fileOf(pFile)
	m := realMethods(f)
	if m.FiVersion < 2 || m.FxShmBarrier == 0 {
		return
	}
	fn[func(*libc.TLS, uintptr)](m.FxShmBarrier)(tls, f.real)
}

func xShmUnmap(tls *libc.TLS, pFile uintptr, deleteFlag int32) int32 {
	f := fileOf(pFile)
	m := realMethods(f)
	if m.FiVersion < 2 || m.FxShmUnmap == 0 {
		return sqlite3.SQLITE_OK
	}
	return fn[func(*libc.TLS, uintptr, int32) int32](m.FxShmUnmap)(tls, f.real, deleteFlag)
}

func xUnfetch(tls *libc.TLS, pFile uintptr, iOfst int64, p uintptr) int32 {
	f := fileOf(pFile)
	m := realMethods(f)
	if m.FiVersion < 3 || m.FxUnfetch == 0 {
		return sqlite3.SQLITE_OK
	}
	return fn[func(*libc.TLS, uintptr, int64, uintptr) int32](m.FxUnfetch)(tls, f.real, iOfst, p)
}
