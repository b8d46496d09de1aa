package jobs

import (
	"encoding/json"
	"testing"
)

// FuzzDecode: job entries come from the network (through a trusted
// writer's signature, but a trusted writer of another version may write
// what this one cannot read): never a panic, and what decodes passes Check.
func FuzzDecode(f *testing.F) {
	j := valid()
	b, _ := json.Marshal(j)
	f.Add(b)
	f.Add([]byte(`{"id":"a","targets":"AAAAAAAAAAA="}`))
	f.Add([]byte(`null`))
	f.Fuzz(func(t *testing.T, b []byte) {
		j, err := Decode(b)
		if err != nil {
			return
		}
		if err := j.Check(); err != nil {
			t.Fatalf("decoded a job that fails Check: %v", err)
		}
	})
}

// FuzzDecodeAck: acks come from every target.
func FuzzDecodeAck(f *testing.F) {
	f.Add([]byte(`{"state":"done","attempts":1,"ok":true,"output_head":"x"}`))
	f.Add([]byte(`{"state":"retrying","retry_at":"2026-01-01T00:00:00Z"}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		a, err := DecodeAck(b)
		if err != nil {
			return
		}
		if err := a.Check(); err != nil {
			t.Fatalf("decoded an ack that fails Check: %v", err)
		}
	})
}
