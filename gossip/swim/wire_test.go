package swim

import (
	"bytes"
	"errors"
	"reflect"
	"testing"
)

func TestFrameRoundTrip(t *testing.T) {
	for _, f := range []Frame{
		{Kind: KindPing},
		{Kind: KindAck, Msg: Message{Updates: []Update{{Node: "b", State: Suspect, Incarnation: 1 << 40, From: "c", Sig: []byte("sig")}}}},
		{Kind: KindPingReq, Target: "t", Msg: Message{Updates: []Update{{Node: "a", State: Left, From: "a"}, {Node: "d", State: Dead, Incarnation: 3, From: "e"}}}},
		{Kind: KindNack},
		{Kind: KindBusy},
		{Kind: KindSync, Msg: Message{Updates: []Update{{Node: "b", State: Dead, Incarnation: 2, From: "c", Sig: []byte("s")}}}},
	} {
		got, err := DecodeFrame(AppendFrame(nil, f))
		if err != nil || !reflect.DeepEqual(got, f) {
			t.Errorf("%+v came back as %+v, %v", f, got, err)
		}
	}
}

func TestDecodeFrameRefuses(t *testing.T) {
	good := AppendFrame(nil, Frame{Kind: KindPing, Msg: Message{Updates: []Update{{Node: "b", From: "c"}}}})
	for name, b := range map[string][]byte{
		"empty":               nil,
		"truncated":           good[:len(good)-1],
		"trailing byte":       append(bytes.Clone(good), 0),
		"unknown kind":        AppendFrame(nil, Frame{Kind: 9}),
		"busy with updates":   AppendFrame(nil, Frame{Kind: KindBusy, Msg: Message{Updates: []Update{{Node: "b", From: "c"}}}}),
		"ping-req, no target": AppendFrame(nil, Frame{Kind: KindPingReq}),
		"ping with a target":  AppendFrame(nil, Frame{Kind: KindPing, Target: "t"}),
		"unknown state":       AppendFrame(nil, Frame{Kind: KindPing, Msg: Message{Updates: []Update{{Node: "b", State: 7, From: "c"}}}}),
		"no accuser":          AppendFrame(nil, Frame{Kind: KindPing, Msg: Message{Updates: []Update{{Node: "b"}}}}),
		"too many updates":    append([]byte{byte(KindPing), 0, maxWireUpdate + 1}, make([]byte, 10)...),
		"too large":           make([]byte, MaxFrame+1),
	} {
		if _, err := DecodeFrame(b); !errors.Is(err, ErrFrame) {
			t.Errorf("%s: %v, want ErrFrame", name, err)
		}
	}
}

// FuzzDecodeFrame: frames come from any peer that can open a stream.
func FuzzDecodeFrame(f *testing.F) {
	f.Add(AppendFrame(nil, Frame{Kind: KindPingReq, Target: "t", Msg: Message{Updates: []Update{{Node: "b", State: Suspect, Incarnation: 9, From: "c", Sig: []byte("s")}}}}))
	f.Add([]byte{1, 0, 0})
	f.Fuzz(func(t *testing.T, b []byte) {
		fr, err := DecodeFrame(b)
		if err != nil {
			return
		}
		if again := AppendFrame(nil, fr); !bytes.Equal(again, b) {
			t.Fatalf("%x decoded to %+v, which encodes as %x", b, fr, again)
		}
	})
}
