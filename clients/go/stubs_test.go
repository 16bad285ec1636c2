package echomq_test

import (
	"os/exec"
	"testing"
)

// TestGeneratedStubsAreFresh regenerates echomqv1/ from ../../proto into a
// temporary directory (./generate --check, buf with the pinned local plugins)
// and fails on any difference: the committed stubs are never stale.
func TestGeneratedStubsAreFresh(t *testing.T) {
	out, err := exec.Command("./generate", "--check").CombinedOutput()
	if err != nil {
		t.Fatalf("./generate --check: %v\n%s", err, out)
	}
}
