//go:build !unix

package natscluster

import (
	"errors"
	"os"
)

// freeze cannot stop a process where there is no SIGSTOP.
func freeze(*os.Process) error { return errors.New("no SIGSTOP on this system") }
