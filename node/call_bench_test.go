package node

import (
	"bufio"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"io"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/tribeagent/tribe/node/api"
	"github.com/tribeagent/tribe/plugins"
)

// rawEcho is the baseline: a bare libp2p protocol on the same hosts that
// echoes one length-prefixed message per stream, as a call does.
const rawEcho = "/tribe-bench/echo/1"

func serveRawEcho(s network.Stream) {
	defer s.Close()
	r := bufio.NewReader(s)
	if err := echoFrame(r, s); err != nil {
		s.Reset()
	}
}

// keptEcho is a second baseline: the same echo, many messages on one
// stream kept open (what a call costs without a stream of its own).
const keptEcho = "/tribe-bench/kept-echo/1"

func serveKeptEcho(s network.Stream) {
	defer s.Close()
	r := bufio.NewReader(s)
	for {
		if err := echoFrame(r, s); err != nil {
			if err != io.EOF {
				s.Reset()
			}
			return
		}
	}
}

// echoFrame reads one length-prefixed message from r and writes it back.
func echoFrame(r *bufio.Reader, w io.Writer) error {
	b, err := recvFrame(r)
	if err != nil {
		return err
	}
	return sendFrame(w, b)
}

// sendFrame writes msg with its length before it.
func sendFrame(w io.Writer, msg []byte) error {
	_, err := w.Write(append(binary.AppendUvarint(nil, uint64(len(msg))), msg...))
	return err
}

// recvFrame reads a message of at most 1 MiB that sendFrame wrote.
func recvFrame(r *bufio.Reader) ([]byte, error) {
	n, err := binary.ReadUvarint(r)
	if err != nil {
		return nil, err
	}
	if n > 1<<20 {
		return nil, errors.New("echo: a message over 1 MiB")
	}
	b := make([]byte, n)
	_, err = io.ReadFull(r, b)
	return b, err
}

// selfCPU is the CPU time (user and system) this process has used.
func selfCPU() time.Duration {
	var ru syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

func rawEchoCall(ctx context.Context, n *Node, to peer.ID, msg []byte) error {
	s, err := n.host.NewStream(ctx, to, rawEcho)
	if err != nil {
		return err
	}
	defer s.Close()
	if err := sendFrame(s, msg); err != nil {
		return err
	}
	s.CloseWrite()
	_, err = recvFrame(bufio.NewReader(s))
	return err
}

// BenchmarkCallVsRawStream compares, between two real nodes on loopback in
// one run, a plugin call (echo, through authorisation and the instance's
// limits) with a raw libp2p stream that echoes the same bytes: latency of
// sequential calls, and calls per second with 16 in flight. Targets:
// latency at most 1.3x, rate at least 0.7x the raw stream's. "node" is the
// whole of node.Call (target resolution, fan-out, result); "proto" is the
// protocol alone (a plugins.Caller, which keeps its streams open between
// calls as the node's does); "oneshot" is the protocol on a stream of its
// own per call (plugins.Call); "kept" is the raw echo on one stream kept
// open. The latencies and CPU per call (both nodes: one process) are of
// sequential calls.
func BenchmarkCallVsRawStream(b *testing.B) {
	a := startNode(b, loopbackConfig(b, "a"))
	cb := loopbackConfig(b, "b")
	cb.Join = []string{tcpAddr(a)}
	bn := startNode(b, cb)
	bn.Host().SetStreamHandler(rawEcho, serveRawEcho)
	bn.Host().SetStreamHandler(keptEcho, serveKeptEcho)
	ctx := context.Background()
	waitFor(b, "a and b to know each other", func() bool { return len(a.nodeRecords()) == 2 && len(bn.nodeRecords()) == 2 })
	if _, err := a.CreateTribe(ctx, "bench"); err != nil {
		b.Fatal(err)
	}
	if _, err := a.Join(ctx, "bench", []string{"a", "b"}); err != nil {
		b.Fatal(err)
	}
	if _, err := a.LoadPlugin(ctx, "echo", "bench", api.LoadRequest{}); err != nil {
		b.Fatal(err)
	}
	waitFor(b, "b to load echo", func() bool {
		_, ok := bn.plugins.get("bench", "echo")
		return ok && a.isMember("bench", bn.ID())
	})

	args := json.RawMessage(`{"payload":"` + strings.Repeat("x", 100) + `"}`)
	raw := func() error { return rawEchoCall(ctx, a, bn.ID(), args) }
	ks, err := a.host.NewStream(ctx, bn.ID(), keptEcho)
	if err != nil {
		b.Fatal(err)
	}
	defer ks.Close()
	kr := bufio.NewReader(ks)
	kept := func() error {
		if err := sendFrame(ks, args); err != nil {
			return err
		}
		_, err := recvFrame(kr)
		return err
	}
	caller := plugins.NewCaller(a.host, 8)
	defer caller.Close()
	oneshot := func() error {
		r := plugins.Call(ctx, a.host, bn.ID(), plugins.Request{ID: "x", Tribe: "bench", Plugin: "echo", Method: "echo", Args: args})
		if !r.OK {
			return &plugins.Error{Code: r.Code, Msg: r.Error}
		}
		return nil
	}
	proto := func() error {
		r := caller.Call(ctx, bn.ID(), plugins.Request{ID: "x", Tribe: "bench", Plugin: "echo", Method: "echo", Args: args})
		if !r.OK {
			return &plugins.Error{Code: r.Code, Msg: r.Error}
		}
		return nil
	}
	whole := func() error {
		var res api.CallResult
		_, err := a.Call(ctx, api.CallRequest{Nodes: []string{bn.ID().String()}, Plugin: "echo", Method: "echo", Args: args},
			func(r api.CallResult) { res = r })
		if err == nil && !res.OK {
			return &plugins.Error{Code: plugins.Code(res.Code), Msg: res.Error}
		}
		return err
	}
	const seq, par, inflight = 300, 2000, 16
	cpu := map[string]time.Duration{} // both nodes' CPU (one process) in sequential calls
	sequential := func(kind string, f func() error) time.Duration {
		start, c0 := time.Now(), selfCPU()
		for range seq {
			if err := f(); err != nil {
				b.Fatal(err)
			}
		}
		cpu[kind] += (selfCPU() - c0) / seq
		return time.Since(start) / seq
	}
	rate := func(f func() error) float64 {
		var wg sync.WaitGroup
		work := make(chan struct{}, par)
		for range par {
			work <- struct{}{}
		}
		close(work)
		errs := make(chan error, inflight)
		start := time.Now()
		for range inflight {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for range work {
					if err := f(); err != nil {
						errs <- err
						return
					}
				}
			}()
		}
		wg.Wait()
		select {
		case err := <-errs:
			b.Fatal(err)
		default:
		}
		return par / time.Since(start).Seconds()
	}
	// Warm up every path (connections, buffers), then alternate the kinds
	// within each iteration so drift on a shared machine hits all alike.
	sequential("raw", raw)
	sequential("kept", kept)
	sequential("oneshot", oneshot)
	sequential("proto", proto)
	sequential("whole", whole)
	clear(cpu)
	var latRaw, latKept, latOneshot, latProto, latWhole time.Duration
	var rateRaw, rateProto, rateWhole float64
	b.ResetTimer()
	for range b.N {
		latRaw += sequential("raw", raw)
		latKept += sequential("kept", kept)
		latOneshot += sequential("oneshot", oneshot)
		latProto += sequential("proto", proto)
		latWhole += sequential("whole", whole)
		rateRaw += rate(raw)
		rateProto += rate(proto)
		rateWhole += rate(whole)
	}
	n := float64(b.N)
	b.ReportMetric(float64(latRaw.Microseconds())/n, "raw_us")
	b.ReportMetric(float64(latProto.Microseconds())/n, "proto_us")
	b.ReportMetric(float64(latWhole.Microseconds())/n, "node_us")
	b.ReportMetric(float64(latProto)/float64(latRaw), "proto/raw_latency")
	b.ReportMetric(float64(latWhole)/float64(latRaw), "node/raw_latency")
	b.ReportMetric(rateRaw/n, "raw_calls/s")
	b.ReportMetric(rateProto/rateRaw, "proto/raw_rate")
	b.ReportMetric(rateWhole/rateRaw, "node/raw_rate")
	b.ReportMetric(float64(latKept.Microseconds())/n, "kept_us")
	b.ReportMetric(float64(latProto)/float64(latKept), "proto/kept_latency")
	b.ReportMetric(float64(latOneshot.Microseconds())/n, "oneshot_us")
	for _, kind := range []string{"raw", "kept", "oneshot", "proto", "whole"} {
		b.ReportMetric(float64(cpu[kind].Microseconds())/n, kind+"_cpu_us")
	}
}
