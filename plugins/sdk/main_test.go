package sdk

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"
)

// The test binary is also a plugin made with Main: started with
// TRIBE_SDK_TEST_PLUGIN set, it serves hangImpl, as a plugin's
// executable would.
func TestMain(m *testing.M) {
	if os.Getenv("TRIBE_SDK_TEST_PLUGIN") != "" {
		Main(Info{Name: "hang", Version: "1", Kind: "processor"}, hangImpl{})
	}
	os.Exit(m.Run())
}

type hangImpl struct{}

// Hang ignores its deadline and its cancel.
func (hangImpl) Hang(ctx context.Context, _ json.RawMessage) (string, error) {
	time.Sleep(time.Hour)
	return "", nil
}

// A plugin whose input ends (its agent died, or closed the pipe) exits
// endGrace later even if a call ignores its cancel, saying so: it ran on
// for good, with nobody to answer.
func TestMainExitsWhenACallOutlivesItsInput(t *testing.T) {
	cmd := exec.Command(os.Args[0])
	cmd.Env = append(os.Environ(), "TRIBE_SDK_TEST_PLUGIN=1")
	var stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = io.Discard, &stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill() })
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	start := time.Now()
	io.WriteString(stdin, `{"jsonrpc":"2.0","id":1,"method":"tribe.call","params":{"method":"hang","timeout_ms":600000}}`+"\n")
	stdin.Close()
	select {
	case err := <-exited:
		var exit *exec.ExitError
		if !errors.As(err, &exit) || exit.ExitCode() != 1 || !strings.Contains(stderr.String(), "still running") {
			t.Fatalf("the plugin exited %v, saying %q; want 1, saying a call was still running", err, stderr.String())
		}
		if took := time.Since(start); took < endGrace {
			t.Errorf("the plugin exited %v after its input ended, before endGrace (%v)", took, endGrace)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the plugin still runs 30 s after its input ended")
	}
}
