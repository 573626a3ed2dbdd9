//go:build !linux

package redisha

import "os/exec"

// setDeathSignal does nothing where the kernel cannot kill a child with its parent: the
// test's cleanups stop the servers.
func setDeathSignal(*exec.Cmd) {}
