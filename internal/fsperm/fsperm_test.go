package fsperm

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestUnsafe(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "f")
	os.WriteFile(path, nil, 0o755)
	for _, c := range []struct {
		mode os.FileMode
		euid int
		want string
	}{
		{0o755, os.Geteuid(), ""},
		{0o700, os.Geteuid(), ""},
		{0o775, os.Geteuid(), "writable by group or others"},
		{0o757, os.Geteuid(), "writable by group or others"},
		{0o755, os.Geteuid() + 1, "neither this user"}, // owned by another user (unless it is root's)
	} {
		if err := os.Chmod(path, c.mode); err != nil {
			t.Fatal(err)
		}
		fi, err := os.Stat(path)
		if err != nil {
			t.Fatal(err)
		}
		got := unsafe(fi, c.euid)
		if os.Geteuid() == 0 && c.euid != 0 && c.want == "neither this user" {
			c.want = "" // a file of root's is never another user's
		}
		if (c.want == "") != (got == "") || !strings.Contains(got, c.want) {
			t.Errorf("mode %v, euid %d: %q, want %q", c.mode, c.euid, got, c.want)
		}
	}
}
