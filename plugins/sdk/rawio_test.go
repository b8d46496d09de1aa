package sdk

import (
	"bytes"
	"io"
	"os"
	"path/filepath"
	"sync"
	"syscall"
	"testing"
	"time"
)

// A rawPipe carries every byte both ways, waiting on the poller when the
// pipe is full or empty, and says io.EOF once the writer closes.
func TestRawPipeCarriesEverything(t *testing.T) {
	var fds [2]int
	if err := syscall.Pipe(fds[:]); err != nil {
		t.Fatal(err)
	}
	r, w := newRawPipe(fds[0], "r"), newRawPipe(fds[1], "w")
	if r == nil || w == nil {
		t.Fatal("a pipe was not taken as a rawPipe")
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

// A regular file is not a rawPipe: reading one can block.
func TestRawPipeRefusesAFile(t *testing.T) {
	f, err := os.Create(filepath.Join(t.TempDir(), "f"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if p := newRawPipe(int(f.Fd()), "f"); p != nil {
		t.Fatal("a regular file was taken as a rawPipe")
	}
}

// Calls run concurrently on workers: ten calls that each wait for all
// ten to have started all finish, twice (the second time partly on the
// workers the first left idle); then no more than maxIdleWorkers stay,
// and all of them end with the server.
func TestWorkersRunCallsConcurrently(t *testing.T) {
	s := &server{work: make(chan func()), quit: make(chan struct{})}
	for range 2 {
		const n = 10
		var started, finished sync.WaitGroup
		started.Add(n)
		finished.Add(n)
		for range n {
			s.run(func() {
				started.Done()
				started.Wait() // all n at once, or this never returns
				finished.Done()
			})
		}
		finished.Wait()
	}
	for deadline := time.Now().Add(time.Minute); s.idle.Load() != maxIdleWorkers; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%d idle workers a minute after the calls, want %d", s.idle.Load(), maxIdleWorkers)
		}
	}
	close(s.quit)
	s.wg.Wait()
	if got := s.idle.Load(); got != 0 {
		t.Fatalf("%d idle workers after the server ended", got)
	}
}
