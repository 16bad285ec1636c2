package echomq_test

import (
	"os/exec"
	"syscall"
)

// childOfTest makes the kernel kill cmd if the test binary dies first, so a
// crashed or interrupted run leaves no redis-server or sidecar behind.
func childOfTest(cmd *exec.Cmd) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
