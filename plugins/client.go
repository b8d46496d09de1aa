package plugins

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"sync"
	"time"

	"github.com/libp2p/go-libp2p/core/host"
	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/core/peer"
)

// Call makes one call to p and returns its answer. Every way a call can
// fail comes back as a Response with a Code; Call never waits past ctx,
// and gives p up as gone when it stays silent for Silence.
func Call(ctx context.Context, h host.Host, p peer.ID, req Request) Response {
	if dl, ok := ctx.Deadline(); ok {
		req.Deadline = max(1, time.Until(dl).Milliseconds())
	}
	b, err := json.Marshal(req)
	if err != nil {
		return Response{ID: req.ID, Code: CodeBadRequest, Error: "arguments: " + err.Error()}
	}
	if len(b) > MaxRequestSize {
		return Response{ID: req.ID, Code: CodeTooLarge, Error: "the request is " + byteSize(len(b)) + ", over the " + byteSize(MaxRequestSize) + " limit"}
	}
	st, err := h.NewStream(ctx, p, ProtocolID)
	if err != nil {
		if r, ok := ctxFailure(ctx, req.ID); ok {
			return r
		}
		if errors.Is(err, network.ErrResourceLimitExceeded) {
			// Ours or the callee's: the error names the scope and the
			// resource (README, "Connection and stream limits").
			return Response{ID: req.ID, Code: CodeBusy, Error: "a connection or stream limit is reached, try again or call fewer nodes at once: " + err.Error()}
		}
		return Response{ID: req.ID, Code: CodeUnreachable, Error: "cannot reach the node: " + err.Error()}
	}
	stop := context.AfterFunc(ctx, func() { st.Reset() })
	defer stop()
	if err := writeFrame(st, b); err != nil {
		st.Reset()
		if r, ok := ctxFailure(ctx, req.ID); ok {
			return r
		}
		return Response{ID: req.ID, Code: CodeGone, Error: "sending the request: " + err.Error()}
	}
	st.CloseWrite()
	br := bufio.NewReader(st)
	for {
		st.SetReadDeadline(time.Now().Add(silence))
		f, err := readFrame(br, MaxResponseSize)
		if err != nil {
			st.Reset()
			if r, ok := ctxFailure(ctx, req.ID); ok {
				return r
			}
			switch {
			case isTimeout(err):
				return Response{ID: req.ID, Code: CodeGone, Error: fmt.Sprintf("no word from the node for %v: it crashed or lost its connection", silence)}
			case errors.Is(err, ErrFrameTooLarge):
				return Response{ID: req.ID, Code: CodeTooLarge, Error: "response: " + err.Error()}
			}
			return Response{ID: req.ID, Code: CodeGone, Error: "the node went away mid-call: " + err.Error()}
		}
		if len(f) == 0 {
			continue // heartbeat
		}
		resp, err := DecodeResponse(f)
		if err == nil && resp.ID != req.ID && resp.ID != "" {
			err = fmt.Errorf("plugins: response to call %q, not %q", resp.ID, req.ID)
		}
		if err != nil {
			st.Reset()
			return Response{ID: req.ID, Code: CodeBadResponse, Error: err.Error()}
		}
		resp.ID = req.ID
		st.Close()
		return resp
	}
}

// isTimeout reports a read deadline passing (yamux and QUIC streams have
// their own error types for it; both say Timeout).
func isTimeout(err error) bool {
	var t interface{ Timeout() bool }
	return errors.Is(err, os.ErrDeadlineExceeded) || (errors.As(err, &t) && t.Timeout())
}

// ctxFailure is the response for a call whose context ended.
func ctxFailure(ctx context.Context, id string) (Response, bool) {
	switch {
	case ctx.Err() == nil:
		return Response{}, false
	case errors.Is(ctx.Err(), context.DeadlineExceeded):
		return Response{ID: id, Code: CodeTimeout, Error: "no answer before the deadline"}, true
	}
	return Response{ID: id, Code: CodeCanceled, Error: "canceled"}, true
}

// FanOut runs call for every target, at most parallel at once, and hands
// each answer to out as soon as it arrives. out is called from one
// goroutine at a time; FanOut returns after the last answer, so call must
// itself respect ctx (Call does).
func FanOut[T any](ctx context.Context, targets []T, parallel int, call func(context.Context, T) Response, out func(T, Response)) {
	if parallel < 1 {
		parallel = 1
	}
	sem := make(chan struct{}, parallel)
	var (
		wg  sync.WaitGroup
		omu sync.Mutex
	)
	for _, t := range targets {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			resp := call(ctx, t)
			<-sem
			omu.Lock()
			defer omu.Unlock()
			out(t, resp)
		}()
	}
	wg.Wait()
}

func byteSize(n int) string {
	switch {
	case n >= 1<<20:
		return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20))
	case n >= 1<<10:
		return fmt.Sprintf("%.1f KiB", float64(n)/(1<<10))
	}
	return fmt.Sprintf("%d bytes", n)
}
