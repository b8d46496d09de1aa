// Package catpipe is the benchmarks' floor for a process boundary: a line
// written to cat and read back, what any plugin's call pays at least.
package catpipe

import (
	"os/exec"
	"testing"
	"time"
)

// Start runs cat for the rest of tb and returns a func that sends line
// (which must end in a newline) through it and back, saying how long that
// took; nil if cat is not installed (logged).
func Start(tb testing.TB, line []byte) func() time.Duration {
	tb.Helper()
	catPath, err := exec.LookPath("cat")
	if err != nil {
		tb.Log("cat is not installed: the pipe baseline is left out")
		return nil
	}
	cat := exec.Command(catPath)
	in, _ := cat.StdinPipe()
	out, _ := cat.StdoutPipe()
	if err := cat.Start(); err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { in.Close(); cat.Wait() })
	got := make([]byte, len(line))
	return func() time.Duration {
		start := time.Now()
		in.Write(line)
		for n := 0; n < len(line); {
			m, err := out.Read(got[n:])
			if err != nil {
				tb.Fatal(err)
			}
			n += m
		}
		return time.Since(start)
	}
}
