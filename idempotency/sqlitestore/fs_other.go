//go:build !linux && !darwin

package sqlitestore

// fileSystem is not implemented on this platform: it returns no name, and Inspect says
// that the file system was not checked.
func fileSystem(string) (string, fsKind, error) { return "", fsUnknown, nil }
