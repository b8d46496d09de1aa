// Package fsperm says whether a file or dir the agent trusts (its data
// dir, its plugin dir, a plugin) could be changed by someone else.
package fsperm

import (
	"fmt"
	"io/fs"
	"os"
	"syscall"
)

// Unsafe says why fi could be changed by someone other than this
// process's user or root, or is "" if it cannot: writable by group or
// others, or owned by another user.
func Unsafe(fi fs.FileInfo) string {
	return unsafe(fi, os.Geteuid())
}

func unsafe(fi fs.FileInfo, euid int) string {
	if fi.Mode().Perm()&0o022 != 0 {
		return fmt.Sprintf("writable by group or others (mode %v; chmod go-w)", fi.Mode().Perm())
	}
	if st, ok := fi.Sys().(*syscall.Stat_t); ok && st.Uid != 0 && int(st.Uid) != euid {
		return fmt.Sprintf("owned by uid %d, neither this user (%d) nor root", st.Uid, euid)
	}
	return ""
}
