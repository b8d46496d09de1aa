package rawpipe

import (
	"bytes"
	"io"
	"os"
	"path/filepath"
	"syscall"
	"testing"
)

// A Pipe carries every byte both ways, waiting on the poller when the
// pipe is full or empty, and says io.EOF once the writer closes.
func TestRawPipeCarriesEverything(t *testing.T) {
	var fds [2]int
	if err := syscall.Pipe(fds[:]); err != nil {
		t.Fatal(err)
	}
	r, w := FromFD(fds[0], "r"), FromFD(fds[1], "w")
	if r == nil || w == nil {
		t.Fatal("a pipe was not taken as a Pipe")
	}
	defer r.f.Close()
	want := bytes.Repeat([]byte("0123456789abcdef"), 1<<16) // 1 MiB: many times what a pipe holds
	errc := make(chan error, 1)
	go func() {
		n, err := w.Write(want)
		if err == nil && n != len(want) {
			err = io.ErrShortWrite
		}
		w.f.Close()
		errc <- err
	}()
	got, err := io.ReadAll(r) // reads small and large; ends at io.EOF
	if err != nil {
		t.Fatal(err)
	}
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Fatalf("read %d bytes, not the %d written", len(got), len(want))
	}
	if n, err := r.Read(make([]byte, 8)); n != 0 || err != io.EOF {
		t.Fatalf("after the writer closed: %d, %v; want 0, io.EOF", n, err)
	}
}

// A regular file is not a Pipe: reading one can block.
func TestRawPipeRefusesAFile(t *testing.T) {
	f, err := os.Create(filepath.Join(t.TempDir(), "f"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if p := FromFD(int(f.Fd()), "f"); p != nil {
		t.Fatal("a regular file was taken as a Pipe")
	}
}
