package sqlitestore

import (
	"syscall"
)

// fileSystem returns the name and kind of the file system that holds path, from
// statfs's f_type.
func fileSystem(path string) (string, fsKind, error) {
	var st syscall.Statfs_t
	if err := syscall.Statfs(path, &st); err != nil {
		return "", fsUnknown, err
	}
	// f_type is a long whose width differs by architecture; every magic fits 32 bits.
	name, kind := linuxFileSystem(uint32(st.Type)) //nolint:gosec // truncation intended, see above
	return name, kind, nil
}
