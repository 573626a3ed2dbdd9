//go:build unix

package natscluster

import (
	"os"
	"syscall"
)

// freeze stops p (SIGSTOP).
func freeze(p *os.Process) error { return p.Signal(syscall.SIGSTOP) }
