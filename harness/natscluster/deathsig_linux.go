package natscluster

import (
	"os/exec"
	"syscall"
)

// setDeathSignal has the kernel kill the server when the test process dies, so that no
// server outlives a test binary that crashed or was killed before its cleanups ran.
func setDeathSignal(cmd *exec.Cmd) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
