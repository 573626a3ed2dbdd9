package sqlitestore

import (
	"syscall"
)

// fileSystem returns the name and kind of the file system that holds path, from
// statfs's f_fstypename.
func fileSystem(path string) (string, fsKind, error) {
	var st syscall.Statfs_t
	if err := syscall.Statfs(path, &st); err != nil {
		return "", fsUnknown, err
	}
	b := make([]byte, 0, len(st.Fstypename))
	for _, c := range st.Fstypename {
		if c == 0 {
			break
		}
		b = append(b, byte(c))
	}
	name := string(b)
	switch name {
	case "apfs", "hfs":
		return name, fsLocal, nil
	case "nfs", "smbfs", "afpfs", "webdav", "cifs":
		return name, fsNetwork, nil
	case "macfuse", "osxfuse", "fuse":
		return name, fsFUSE, nil
	}
	return name, fsUnknown, nil
}
