//go:build !linux

package natscluster

import "os/exec"

// setDeathSignal does nothing where the kernel cannot kill a child with its parent: the
// test's cleanups stop the servers.
func setDeathSignal(*exec.Cmd) {}
