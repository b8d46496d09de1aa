package tasks

import (
	"encoding/json"
	"reflect"
	"testing"
	"time"
)

// FuzzDecodeManifest: manifests arrive in entries from the network. Any
// bytes decode or are refused without panicking; one that decodes
// survives a JSON round trip unchanged and has a schedule that can be
// asked for its next run.
func FuzzDecodeManifest(f *testing.F) {
	f.Add([]byte(yamlManifest))
	f.Add([]byte(`{"name":"c","schedule":{"cron":"*/5 * * * *"},"workflow":{"collect":{"plugin":"sys","method":"collect"}}}`))
	f.Add([]byte("name: t\nschedule: {interval: 1s, start: 2026-11-24T10:00:00Z}\nworkflow: {collect: {plugin: a, method: b}}\n"))
	f.Fuzz(func(t *testing.T, b []byte) {
		m, err := Decode(b)
		if err != nil {
			return
		}
		js, err := json.Marshal(m)
		if err != nil {
			t.Fatalf("encoding %+v: %v", m, err)
		}
		back, err := Decode(js)
		if err != nil {
			t.Fatalf("a decoded manifest does not decode again: %v\n%s", err, js)
		}
		if !reflect.DeepEqual(m, back) {
			t.Fatalf("round trip changed it:\n%+v\n%+v", m, back)
		}
		t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
		m.Schedule.Next(t0, t0, 0, SplayOffset(m.Schedule.Splay, "a", m.Name))
	})
}
