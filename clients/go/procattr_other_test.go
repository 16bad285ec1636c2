//go:build !linux

package echomq_test

import "os/exec"

// childOfTest: only Linux can tie a child's life to the test binary's; the
// fixture's cleanup stops the processes on a normal end.
func childOfTest(*exec.Cmd) {}
